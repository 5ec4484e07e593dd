"""Where a run stands inside an epoch: the data position a mid-epoch record holds, and the
exact continuation of the epoch from it.

A mid-epoch record (``Checkpointer(every_steps=N)``) holds the batches of its epoch
consumed, the sum of their losses (so the epoch's mean training loss comes out the same),
the state of every generator when the epoch began and, when the train split speaks the
protocol of torchdata's ``StatefulDataLoader`` (``state_dict()``/``load_state_dict()``, as
``TensorBatches`` does), the split's own state. A resume continues the epoch at the next
batch: in O(1) through ``load_state_dict``, or else by a replay: the generators go back to
where they were when the epoch began, the split is iterated afresh and the consumed
batches are read and skipped (the model does not see them). Either way the generators are
then put back to the record's own state, so the steps that follow draw what the
uninterrupted run drew. A split whose ``state_dict()`` a record cannot store (it holds
objects that would need pickle) is replayed too: its records say why, and so does the
warning (once per handle when it writes, and again at the resume).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from nitro_core.errors import WEIGHTS_ONLY, NitroWarning, RecordError, ResumeRefused
from nitro_core.state import records, rng
from nitro_core.training.loop import Cursor

EPOCH_RNG = "rng/epoch/"  # tensors of the generators at the epoch's start


def stateful(split: Any) -> bool:
    """Whether ``split`` can say where it is: ``state_dict()`` and ``load_state_dict()``."""
    return callable(getattr(split, "state_dict", None)) and callable(
        getattr(split, "load_state_dict", None)
    )


def unstorable(state: Any) -> str | None:
    """Why a record cannot hold ``state`` (a split's ``state_dict()``), or None when it can."""
    try:
        records.encode_tree(state, records.TREE_PREFIXES["data"], {}, leaf=lambda _, t: t)
    except RecordError as exc:
        return str(exc)
    return None


@dataclass
class Held:
    """What reading a batch ahead moves, captured before the read: every generator and the
    train split's ``state_dict()`` (None without one). A point of a split without a length
    reads its next batch first (does the epoch end here?) and records this state."""

    rng: rng.RngState
    data: Any


def hold(split: Any) -> Held:
    """The state a read of ``split``'s next batch would move."""
    return Held(rng.capture(), split.state_dict() if stateful(split) else None)


@dataclass
class Position:
    """A mid-epoch record's place in its epoch, read back."""

    batch: int  # batches of the epoch consumed
    loss_sum: torch.Tensor  # their summed training loss, as the loop kept it
    epoch_rng: rng.RngState  # every generator when the epoch began
    data: Any  # the train split's state_dict(), or None when it has none
    unstored: str | None = None  # why the record holds no state_dict() of a split with one


def header(cursor: Cursor, epoch_rng: rng.RngState) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the header's ``position``, its tensors by name under ``rng/``) for a mid-epoch point."""
    json_state, tensors = epoch_rng
    loss_sum = cursor.loss_sum.detach()
    position = {
        "batch": cursor.batches,
        # a float32 (or float16, bfloat16) value is exact as a Python float, and back
        "loss_sum": float(loss_sum.item()),
        "loss_dtype": str(loss_sum.dtype).removeprefix("torch."),
        "epoch_rng": json_state,
    }
    return position, {f"epoch/{k}": v for k, v in tensors.items()}


def read(rec: records.Record) -> Position | None:
    """The position a record holds (None at an epoch end)."""
    meta = rec.meta
    position = meta.get("position")
    if meta.get("batch") is None or position is None:
        return None
    loss_sum = torch.tensor(position["loss_sum"], dtype=getattr(torch, position["loss_dtype"]))
    epoch_rng = (position["epoch_rng"], rec.rng_tensors(EPOCH_RNG))
    data = rec.tree("data")
    return Position(int(meta["batch"]), loss_sum, epoch_rng, data, position.get("unstored"))


def check_length(position: Position, split: Any, epoch: int, file: str) -> None:
    """Refuse a record that consumed more batches of its epoch than the split now yields."""
    try:
        total = len(split)
    except TypeError:
        return
    if position.batch >= total:
        raise ResumeRefused(
            f"Cannot resume {file!r}: it was written after batch {position.batch} of epoch "
            f"{epoch}, and the train split now yields {total} batches an epoch, so there is "
            "no next batch to continue from. Restore the data the record was trained on, or "
            "start a new run that takes only the weights: ",
            WEIGHTS_ONLY,
            ".",
        )


def reopen(
    split: Any, position: Position, epoch: int, device: torch.device
) -> tuple[Iterator[Any], Cursor]:
    """An iterator over the rest of epoch ``epoch`` and the cursor it continues, the
    generators left as they were when the epoch began (the caller restores the record's)."""
    rng.restore(*position.epoch_rng)
    if position.data is not None and stateful(split):
        split.load_state_dict(position.data)
        batches = iter(split)
    else:
        fix = (
            "Return a split that can say where it is from build_data(), e.g. "
            "torchdata.stateful_dataloader.StatefulDataLoader or nitro_core.TensorBatches"
        )
        if not stateful(split):
            why = f"the train split ({type(split).__name__}) has no state_dict()/load_state_dict()"
        elif position.unstored is not None:
            why = (
                "the record holds no state of the train split, whose state_dict() a record "
                f"could not store ({position.unstored.removesuffix('.')})"
            )
            fix = "Make its state_dict() storable as that says"
        else:
            why = (
                "the record holds no state of the train split (it was written by one without "
                "state_dict()/load_state_dict())"
            )
        warnings.warn(
            f"Resuming mid-epoch: {why}, so its first "
            f"{position.batch} batches of epoch {epoch} are replayed from the epoch's start "
            "(read again and skipped, as long as reading them took; the model does not run) "
            f"to reach the record's place. {fix}, and the resume costs O(1).",
            NitroWarning,
            stacklevel=5,
        )
        batches = iter(split)
        for consumed in range(position.batch):
            try:
                next(batches)
            except StopIteration:
                raise ResumeRefused(
                    f"Cannot resume mid-epoch: the train split yielded {consumed} batches of "
                    f"epoch {epoch} on replay, and the record was written after batch "
                    f"{position.batch}. Restore the data the record was trained on, or start a "
                    "new run that takes only the weights: ",
                    WEIGHTS_ONLY,
                    ".",
                ) from None
    return batches, Cursor.start(device, position.batch, position.loss_sum)
