"""Checkpoint points every N optimizer steps (``Checkpointer(every_steps=N)``): each one
validates, decides stops, logs and offers a record as an epoch end does; mid-epoch records
say where they are (file name, manifest ``batch``); ``Last``/``Best`` count every point,
``Every``/``Epochs`` only epoch ends; and evaluation never moves the training trajectory."""

from __future__ import annotations

import json
import re

import pytest
import torch
from pydantic import PrivateAttr

from nitro_core import (
    Average,
    Best,
    Checkpointer,
    ConfigError,
    EarlyStopping,
    Epochs,
    Every,
    Last,
    Nitro,
    NonFiniteLoss,
    Plateau,
    read_manifest,
)
from nitro_core.policy.selectors import pick
from nitro_core.sources.grammar import parse_keep
from nitro_core.sources.selection import keep_holds, name_points
from nitro_core.store.manifest import ManifestEntry, Point, read_points
from nitro_core.training.checkpointing import record_name

from ..steps import Steps

# Steps(): 8 batches an epoch, a point every 3 steps: (epoch, batch, step) of each point
POINTS = [
    (1, 3, 3), (1, 6, 6), (1, None, 8),
    (2, 1, 9), (2, 4, 12), (2, 7, 15), (2, None, 16),
    (3, 2, 18), (3, 5, 21), (3, None, 24),
]  # fmt: skip


class Keeping(Steps):
    """Steps with a keep given as text."""

    keep_text: str = "(Last(100))"

    def checkpointer(self):
        return Checkpointer(keep=parse_keep(self.keep_text), every_steps=self.every)


class ScriptedPoints(Keeping):
    """Validation reports ``scores[i]`` as 'score' (min) at the i-th point."""

    scores: tuple[float, ...] = (5.0, 1.0, 4.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0, 0.5)
    _calls: list[int] = PrivateAttr(default_factory=list)

    def metrics(self, model, batch):
        return {"n": (1, 1)}

    def finalize_metrics(self, totals, split):
        self._calls.append(1)
        return {"score": self.scores[len(self._calls) - 1]}

    def monitor(self):
        return ("score", "min")


def where(entries):
    return [(e.epoch, e.batch, e.step) for e in entries]


def test_a_point_after_every_n_steps_and_at_each_epoch_end(tmp_path):
    rows = []
    n = Nitro(Keeping(), run_dir=tmp_path).train(on_epoch=rows.append)
    assert [(r["epoch"], r.get("batch"), r["step"]) for r in n.history] == POINTS
    assert rows == n.history  # on_epoch at every point
    assert set(n.history[0]) == {"epoch", "batch", "step", "train_loss", "lr", "val", "seconds"}
    assert set(n.history[2]) == {"epoch", "step", "train_loss", "lr", "val", "seconds"}
    assert all(set(r["val"]) == {"loss"} for r in n.history)
    log = tmp_path / "logs" / f"{n.run_id}.jsonl"
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["epoch"], r.get("batch"), r["step"]) for r in logged] == POINTS
    assert (n.epoch, n.batch, n.step, n.stop_reason) == (3, None, 24, "completed")


def test_mid_epoch_records_say_where_they_are_in_the_name_and_the_manifest(tmp_path):
    Nitro(Keeping(), run_dir=tmp_path).train()
    entries = read_manifest(tmp_path)
    assert where(entries) == POINTS
    for e in entries:
        assert e.file == record_name(e.epoch, e.step, e.score, "loss", None, e.batch)
    assert re.fullmatch(
        r"epoch-0002-batch-0004-step-12-loss=[0-9.e-]+\.safetensors", entries[4].file
    )
    assert re.fullmatch(r"epoch-0002-step-16-loss=[0-9.e-]+\.safetensors", entries[6].file)
    listed = json.loads((tmp_path / "manifest.json").read_text())
    assert [e["batch"] for e in listed["entries"]] == [b for _, b, _ in POINTS]
    points = read_points(tmp_path)[entries[0].run]
    assert [(p.epoch, p.batch, p.step) for p in points] == POINTS


def test_record_names_carry_the_batch_of_a_mid_epoch_record():
    assert (
        record_name(3, 4500, 0.0416831, "loss", None, 250)
        == "epoch-0003-batch-0250-step-4500-loss=0.0416831.safetensors"
    )
    assert record_name(6, 4500, 0.0416831, "loss", None) == (
        "epoch-0006-step-4500-loss=0.0416831.safetensors"
    )


@pytest.mark.parametrize(
    ("keep", "kept"),
    [
        ("(Last(2))", [(3, 5, 21), (3, None, 24)]),
        ("(Every(1))", [(1, None, 8), (2, None, 16), (3, None, 24)]),
        ("(Every(2))", [(2, None, 16)]),
        ("(Epochs([1, 3]))", [(1, None, 8), (3, None, 24)]),
        ("(Epochs(2:3), Last(1))", [(2, None, 16), (3, None, 24)]),
    ],
)
def test_last_keeps_the_latest_points_and_every_epochs_keep_epoch_ends(tmp_path, keep, kept):
    n = Nitro(Keeping(keep_text=keep), run_dir=tmp_path).train()
    assert where(read_manifest(tmp_path)) == kept
    names = sorted(p.name for p in tmp_path.glob("*.safetensors*"))
    assert names == sorted(e.file for e in read_manifest(tmp_path))  # nothing else written
    assert len(read_points(tmp_path)[n.run_id]) == len(POINTS)  # every point still counts


def test_best_ranks_every_scored_point_mid_epoch_ones_too(tmp_path):
    Nitro(ScriptedPoints(keep_text="(Best(2))"), run_dir=tmp_path).train()
    kept = read_manifest(tmp_path)
    assert [(e.epoch, e.batch, e.score) for e in kept] == [(1, 6, 1.0), (3, None, 0.5)]


def test_pick_and_name_points_take_epoch_ends_only_for_every_and_epochs():
    entries = [
        ManifestEntry(
            file=f"e{e}-{b}.safetensors", epoch=e, batch=b, step=s, score=None, metric=None,
            mode=None, stop_reason=None, run="r", written="t", bytes=1, sha256="0" * 64,
        )
        for e, b, s in POINTS
    ]  # fmt: skip
    assert where(pick(Every(1), entries, None)) == [(1, None, 8), (2, None, 16), (3, None, 24)]
    assert where(pick(Epochs(2), entries, None)) == [(2, None, 16)]
    assert where(pick(Last(2), entries, None)) == [(3, 5, 21), (3, None, 24)]
    points = [Point(epoch=e, batch=b, step=s) for e, b, s in POINTS]
    named, _ = name_points(Every(3), points, (None, None))
    assert [(p.epoch, p.batch) for p in named] == [(3, None)]
    named, _ = name_points(Epochs([1, 2]), points, (None, None))
    assert [(p.epoch, p.batch) for p in named] == [(1, None), (2, None)]


@pytest.mark.parametrize(
    ("keep", "selector", "holds"),
    [
        ((Last(10),), Last(6), True),
        ((Last(5),), Last(6), False),
        ((Last(10),), Every(2), False),  # ten points may all lie in the last epoch
        ((Last(10),), Best(2), False),
        ((Best(3), Last(1)), Best(2), True),
        ((Every(2), Last(1)), Every(4), True),
        ((Epochs([2, 4, 6]),), Every(2), True),
        ((Last(3),), Best(1, among=Last(3)), True),
        ((Last(10),), Best(1, among=Every(2)), False),
        ((Last(1),), Epochs([9]), True),  # past max_epochs: the end-of-training warning's business
    ],
)
def test_a_keep_holds_points_not_epochs_when_epochs_hold_several(keep, selector, holds):
    assert keep_holds(keep, selector, last_epoch=6, mid_epoch=True) is holds


def test_restore_best_refuses_a_last_keep_that_cannot_hold_epochs_of_points(tmp_path):
    with pytest.raises(ConfigError) as err:
        Nitro(Keeping(keep_text="(Last(10))"), run_dir=tmp_path, restore_best=Average(Every(1)))
    assert str(err.value) == (
        "restore_best=Average(Every(1)) needs records that keep=(Last(10)) does not hold at the "
        "end of training (max_epochs=3). Keep them: Checkpointer(keep=(Last(10), Every(1)))."
    )


def test_early_stopping_and_plateau_count_points(tmp_path):
    class Stops(ScriptedPoints):
        scores: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0)

        def early_stopping(self):
            return EarlyStopping(patience=3)

        def plateau(self):
            return Plateau(patience=1, factor=0.5)

        def lr_scheduler(self, optimizer, total_steps):
            return None  # the plateau alone moves the learning rate

    n = Nitro(Stops(), run_dir=tmp_path).train()
    assert (n.epoch, n.batch, n.step, n.stop_reason) == (2, 1, 9, "early_stop")
    assert [(r["epoch"], r.get("batch")) for r in n.history] == [(1, 3), (1, 6), (1, None), (2, 1)]
    assert [r["lr"] for r in n.history] == [0.05, 0.05, 0.025, 0.025]  # 2 bad points: halved
    last = read_manifest(tmp_path)[-1]
    assert (last.epoch, last.batch, last.stop_reason) == (2, 1, "early_stop")


def test_a_run_with_points_trains_exactly_as_the_same_run_without(tmp_path):
    """Validation at every step draws nothing from the training generators (dropout)."""
    with_points = Nitro(Steps(every=1, keep=1), run_dir=tmp_path / "a").train()
    rng_with = torch.get_rng_state()
    without = Nitro(Steps(every=None, keep=1), run_dir=tmp_path / "b").train()
    assert torch.equal(rng_with, torch.get_rng_state())
    for k, v in with_points.model.state_dict().items():
        assert torch.equal(v, without.model.state_dict()[k]), k
    ends = [r for r in with_points.history if "batch" not in r]
    strip = [
        [{k: v for k, v in r.items() if k != "seconds"} for r in rows]
        for rows in (ends, without.history)
    ]
    assert strip[0] == strip[1]
    assert len(with_points.history) == 24


def test_a_non_finite_loss_stops_at_the_next_point_before_it_writes(tmp_path):
    class Poisoned(Keeping):
        _calls: list[int] = PrivateAttr(default_factory=list)

        def loss(self, model, batch):
            loss = super().loss(model, batch)
            if model.training:
                self._calls.append(1)
                if len(self._calls) == 11:  # epoch 2, batch 3
                    return loss * float("nan")
            return loss

    with pytest.raises(NonFiniteLoss) as err:
        Nitro(Poisoned(), run_dir=tmp_path).train()
    assert str(err.value) == (
        "The training loss became non-finite at epoch 2, step 11 (batch 3 of the epoch): the run "
        "stopped before writing anything past batch 1 of epoch 2, and the records already on "
        "disk stay. Lower the learning rate, clip gradients or check the data, then continue "
        "from the last record with resume='auto'."
    )
    assert where(read_manifest(tmp_path))[-1] == (2, 1, 9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"every_steps": 0},
            "Checkpointer(every_steps=0): every_steps is a positive number of optimizer steps "
            "between checkpoint points, or None for epoch ends only; write e.g. "
            "Checkpointer(every_steps=500).",
        ),
        (
            {"every_steps": True},
            "Checkpointer(every_steps=True): every_steps is a positive number of optimizer steps "
            "between checkpoint points, or None for epoch ends only; write e.g. "
            "Checkpointer(every_steps=500).",
        ),
        (
            {"async_write": "yes"},
            "Checkpointer(async_write='yes'): write True (records written on a background "
            "thread, the default) or False (written before training goes on).",
        ),
    ],
)
def test_checkpointer_refuses_a_bad_every_steps_or_async_write(kwargs, message):
    with pytest.raises(ConfigError) as err:
        Checkpointer(keep=Last(1), **kwargs)
    assert str(err.value) == message


def test_checkpointer_defaults_write_asynchronously_at_epoch_ends():
    ckpt = Checkpointer()
    assert (ckpt.every_steps, ckpt.async_write) == (None, True)
    assert Checkpointer(every_steps=500, async_write=False).every_steps == 500
