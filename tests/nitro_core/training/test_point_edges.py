"""Edges of checkpoint points in long runs: a train split that cannot say its length (its
epoch end is the point at its last batch, as a sized split's is), a split whose
``state_dict()`` a record cannot store (replayed on a resume, with the reason), and the
history a point hands to a background write (shared rows, not an O(points) copy), and the
non-finite check a step leaves on the device (folded every ``FOLD`` steps)."""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from pydantic import PrivateAttr

from nitro_core import Nitro, NitroWarning, NonFiniteLoss, TensorBatches, read_manifest
from nitro_core.store.recordio import read_header
from nitro_core.training import loop
from nitro_core.training.checkpointing import OneFile
from tests.nitro_core.training.test_mid_epoch_resume import a_b_c, assert_same_run

from ..steps import Steps, stop_at_step


class Unsized:
    """A split that cannot say its length (a stream, a generator-backed dataset)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[Any]:
        return iter(self.inner)


class UnsizedStateful(Unsized):
    """A split without a length that says where it is (O(1) resume)."""

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


class Streams(Steps):
    """Steps, 8 batches an epoch and a point every 4 steps (the second on the epoch's last
    batch); ``sized=False`` hides the train split's length."""

    sized: bool = False
    every: int | None = 4

    def lr_scheduler(self, optimizer: torch.optim.Optimizer, total_steps: int | None) -> Any:
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)  # no length

    def build_data(self) -> dict[str, Any]:
        data = super().build_data()
        if not self.sized:
            wrap = UnsizedStateful if self.split == "tensor" else Unsized
            data["train"] = wrap(data["train"])
        return data


# (epoch, batch, step) of each point: no mid-epoch point at step 8, 16, 24 (the epoch ends)
STREAM_POINTS = [(1, 4, 4), (1, None, 8), (2, 4, 12), (2, None, 16), (3, 4, 20), (3, None, 24)]


def rows_of(n: Nitro) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in n.history]


@pytest.mark.parametrize("split", ["tensor", "plain"])
def test_a_split_without_a_length_has_one_point_where_its_epoch_ends(tmp_path, split):
    sized = Nitro(Streams(split=split, sized=True), run_dir=tmp_path / "sized").train()
    unsized = Nitro(Streams(split=split), run_dir=tmp_path / "unsized").train()
    assert [(r["epoch"], r.get("batch"), r["step"]) for r in unsized.history] == STREAM_POINTS
    assert rows_of(unsized) == rows_of(sized)
    entries = read_manifest(tmp_path / "unsized")
    assert [(e.epoch, e.batch, e.step) for e in entries] == STREAM_POINTS[-2:]  # Last(2)
    for k, v in sized.model.state_dict().items():
        assert torch.equal(v, unsized.model.state_dict()[k]), k


@pytest.mark.parametrize("split", ["tensor", "plain"])
def test_a_point_that_read_a_batch_ahead_resumes_exactly(tmp_path, split):
    """The point at step 12 read batch 5 of epoch 2 first (does the epoch end?): its record
    holds the generators and the split's position from before that read."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NitroWarning)  # the plain split is replayed
        a, b, c, rng_a = a_b_c(tmp_path, Streams(split=split), 12)
    assert (b.epoch, b.batch) == (2, 4)
    assert_same_run(a, c)
    assert torch.equal(rng_a, torch.get_rng_state())


@pytest.mark.parametrize("split", ["tensor", "plain"])
def test_the_same_handle_continues_after_a_point_that_read_a_batch_ahead(tmp_path, split):
    a = Nitro(Streams(split=split), run_dir=tmp_path / "a").train()
    b = Nitro(Streams(split=split), run_dir=tmp_path / "b")
    stop_at_step(b, 12)
    b.train()
    assert (b.epoch, b.batch, b.stop_reason) == (2, 4, "requested")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NitroWarning)
        b.train()
    assert b.stop_reason == "completed"
    assert_same_run(a, b)


# -- a state_dict() a record cannot store --------------------------------------------------
class Opaque:
    """Something only pickle could store."""


class OpaqueBatches(TensorBatches):
    """TensorBatches whose state_dict() carries an arbitrary object."""

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "note": Opaque()}


class OpaqueSteps(Steps):
    def build_data(self) -> dict[str, Any]:
        data = super().build_data()
        inner = data["train"]
        data["train"] = OpaqueBatches(inner.tensors, inner.batch_size, shuffle=True)
        return data


UNSTORED = (
    "Record leaf 'rng/data/note' holds a Opaque, which a record cannot store without pickle; "
    "keep tensors, numbers, strings, lists and dicts in state_dict()."
)


def test_a_split_state_a_record_cannot_store_falls_back_to_the_replay(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NitroWarning)
        a = Nitro(OpaqueSteps(), run_dir=tmp_path / "a").train()
    b = Nitro(OpaqueSteps(), run_dir=tmp_path / "b")
    stop_at_step(b, 12)  # epoch 2, batch 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b.train()
    said = [str(w.message) for w in caught if issubclass(w.category, NitroWarning)]
    assert (
        said
        == [  # once, though several mid-epoch records were written
            "Mid-epoch records of this run hold no position of the train split (OpaqueBatches): "
            + UNSTORED
            + " Until then a resume from a mid-epoch record replays the epoch's consumed batches "
            "from its start (read again and skipped, as long as reading them took) instead of "
            "costing O(1)."
        ]
    )
    meta = read_header(tmp_path / "b" / read_manifest(tmp_path / "b")[-1].file)
    assert meta["batch"] == 4 and "data" not in meta
    assert meta["position"]["unstored"] == UNSTORED
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = Nitro(OpaqueSteps(), run_dir=tmp_path / "b", resume="auto")
        c.train()
    said = [str(w.message) for w in caught if issubclass(w.category, NitroWarning)]
    assert said[0] == (
        "Resuming mid-epoch: the record holds no state of the train split, whose state_dict() "
        "a record could not store (Record leaf 'rng/data/note' holds a Opaque, which a record "
        "cannot store without pickle; keep tensors, numbers, strings, lists and dicts in "
        "state_dict()), so its first 4 batches of epoch 2 are replayed from the epoch's start "
        "(read again and skipped, as long as reading them took; the model does not run) to "
        "reach the record's place. Make its state_dict() storable as that says, and the resume "
        "costs O(1)."
    )
    assert_same_run(a, c)


# -- the history a point hands to a background write ---------------------------------------
def committed_metas(monkeypatch: pytest.MonkeyPatch, gate: threading.Event | None = None) -> list:
    """Record the header of every record the writer commits (after ``gate`` is set)."""
    metas: list[dict[str, Any]] = []
    real = OneFile._write

    def write(self: OneFile, claim, tensors, meta):
        if gate is not None:
            gate.wait(30)
        metas.append(meta)
        return real(self, claim, tensors, meta)

    monkeypatch.setattr(OneFile, "_write", write)
    return metas


def test_a_point_hands_the_history_rows_to_the_writer_without_copying_them(tmp_path, monkeypatch):
    """A background write must not hold a list the next point appends to, and a copy of the
    rows per point would cost O(points) each: the rows are shared, the list is not."""
    metas = committed_metas(monkeypatch)
    n = Nitro(Steps(keep=100), run_dir=tmp_path).train()
    assert len(metas) == len(n.history) == 10
    for i, meta in enumerate(metas):
        assert meta["history"] is not n.history
        assert len(meta["history"]) == i + 1
        assert all(row is n.history[j] for j, row in enumerate(meta["history"]))


def test_on_epoch_changing_its_row_changes_no_record_in_flight(tmp_path, monkeypatch):
    """on_epoch runs while the point's record is still being written (the history rows are
    shared with that write, not copied): the row it gets is its own to change."""
    gate = threading.Event()
    committed_metas(monkeypatch, gate)

    def on_epoch(row: dict[str, Any]) -> None:
        row["val"]["mine"] = 1.0
        row["note"] = "mine"
        gate.set()  # the write of this point's record starts only now

    n = Nitro(Steps(keep=100), run_dir=tmp_path).train(on_epoch=on_epoch)
    assert all("note" not in r and "mine" not in r["val"] for r in n.history)
    first = read_header(tmp_path / read_manifest(tmp_path)[0].file)
    assert first["history"] == [json.loads(json.dumps(n.history[0]))]


# -- the non-finite check, folded on the device every FOLD steps ----------------------------
class Poisoned(Steps):
    """Steps whose training loss is NaN at the 11th and 13th batch (epoch 2, batches 3, 5)."""

    every: int | None = None
    _calls: list[int] = PrivateAttr(default_factory=list)

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        loss = super().loss(model, batch)
        if model.training:
            self._calls.append(1)
            if len(self._calls) in (11, 13):
                return loss * float("nan")
        return loss


@pytest.mark.parametrize("fold", [1, 2, 3, 256])
def test_the_first_non_finite_loss_is_named_wherever_the_folds_fall(tmp_path, monkeypatch, fold):
    monkeypatch.setattr(loop, "FOLD", fold)
    with pytest.raises(NonFiniteLoss) as err:
        Nitro(Poisoned(), run_dir=tmp_path).train()
    assert str(err.value) == (
        "The training loss became non-finite at epoch 2, step 11 (batch 3 of the epoch): the run "
        "stopped before writing anything for epoch 2, and the records already on disk stay. "
        "Lower the learning rate, clip gradients or check the data, then continue from the "
        "last record with resume='auto'."
    )
    assert [(e.epoch, e.batch) for e in read_manifest(tmp_path)] == [(1, None)]
