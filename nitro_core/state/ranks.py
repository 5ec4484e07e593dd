"""Per-rank state in a record written by several processes. Pure: no I/O, no collectives.

Under DDP the parameters and optimizer state are replicated, so rank 0 writes them once;
what differs between ranks is where each one's generators and train split stand. The
record keeps rank 0's in the usual places (header ``rng``, ``position.epoch_rng``,
``data``; tensors under ``rng/``) and every other rank's under the header's ``ranks``
(``{"world": N, "states": [rank 1's, rank 2's, ...]}``) with tensors under
``rng/rank<r>/``. A mid-epoch record also keeps each rank's running sum of its training
losses (``position.loss_sum`` for rank 0, ``loss_sum`` in the others' rows): the history
row's ``train_loss`` is the mean over the ranks of each one's own sum. :func:`view` gives
the record as rank ``r`` resumes it: its own state in the usual places, so the rest of the
resume path is the one-process path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nitro_core.errors import RecordError
from nitro_core.state import records


@dataclass
class RankState:
    """One rank's part of a record: its generators now and when the epoch began, the sum
    of its training losses so far in the epoch (both at a mid-epoch point), and its train
    split's ``state_dict()``."""

    rng: dict[str, Any]  # JSON part of rng.capture()
    rng_tensors: dict[str, torch.Tensor]
    epoch_rng: tuple[dict[str, Any], dict[str, torch.Tensor]] | None = None
    data: Any = None
    loss_sum: float | None = None  # a float32 (or float16, bfloat16) value: exact as a float


def rank_prefix(rank: int) -> str:
    return f"rng/rank{rank}/"


def attach(
    header: dict[str, Any], tensors: dict[str, torch.Tensor], states: list[RankState]
) -> None:
    """Add ranks 1.. of ``states`` (rank 0's is the record's own) to a record's header and
    tensors (``tensors`` are record names: ``rng/rank1/torch``)."""
    rows = []
    for rank, state in enumerate(states[1:], start=1):
        prefix = rank_prefix(rank)
        own: dict[str, torch.Tensor] = {}
        row: dict[str, Any] = {"rng": state.rng, "epoch_rng": None, "data": None}
        if state.loss_sum is not None:
            row["loss_sum"] = state.loss_sum
        for k, v in state.rng_tensors.items():
            tensors[f"{prefix}{k}"] = records.to_host(v)
        if state.epoch_rng is not None:
            row["epoch_rng"] = state.epoch_rng[0]
            for k, v in state.epoch_rng[1].items():
                tensors[f"{prefix}epoch/{k}"] = records.to_host(v)
        if state.data is not None:
            try:
                row["data"] = records.encode_tree(state.data, f"{prefix}data", own)
            except RecordError:  # not storable without pickle: that rank replays (a warning)
                own = {}
            tensors.update(own)
        rows.append(row)
    header["ranks"] = {"world": len(states), "states": rows}


def recorded_world(meta: dict[str, Any]) -> int:
    """How many processes wrote the record (1 for a one-process record)."""
    ranks = meta.get("ranks")
    return int(ranks["world"]) if isinstance(ranks, dict) else 1


def view(rec: records.Record, rank: int) -> records.Record:
    """``rec`` as rank ``rank`` resumes it. A rank the record has no state for (a resume on
    more processes than wrote it) takes the state of rank ``rank % world``."""
    world = recorded_world(rec.meta)
    source = rank % world
    if source == 0:
        return rec
    row = rec.meta["ranks"]["states"][source - 1]
    prefix = rank_prefix(source)
    meta = dict(rec.meta)
    meta["rng"] = row["rng"]
    if isinstance(meta.get("position"), dict):
        own = {"epoch_rng": row["epoch_rng"]}
        if "loss_sum" in row:  # absent in records written before ranks kept their own
            own["loss_sum"] = row["loss_sum"]
        meta["position"] = {**meta["position"], **own}
    meta["data"] = row["data"]
    tensors = {
        k: v for k, v in rec.tensors.items() if not k.startswith("rng/") or k.startswith("rng/rank")
    }
    for k, v in rec.tensors.items():
        if k.startswith(prefix) and not k.startswith(f"{prefix}data"):
            tensors["rng/" + k.removeprefix(prefix)] = v
    return records.Record(meta=meta, tensors=tensors)
