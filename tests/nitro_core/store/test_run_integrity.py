"""A run stays one timeline: the RNG is restored when training starts, a handle touches a
run's files only once it holds the run, a stale handle is refused, and a non-finite loss
stops the run before anything is written."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch
from pydantic import PrivateAttr

from nitro_core import (
    Nitro,
    NitroWarning,
    NonFiniteLoss,
    TrainingRefused,
    read_manifest,
)
from nitro_core.examples import Classifier
from tests.nitro_core.training.test_resume import Scheduled, _train_epochs, assert_same_state

from ..tiny import KeepLast, WithAcc


def _disturb(n: Nitro) -> None:
    """Everything a user might do between construction and train()."""
    torch.randn(3)
    random.random()
    np.random.rand(2)
    n.validate()


@pytest.mark.parametrize(
    "experiment", [Scheduled(max_epochs=4), Classifier(samples=256, max_epochs=4)]
)
def test_draws_between_resume_and_train_do_not_move_the_trajectory(tmp_path, experiment):
    a = Nitro(experiment, run_dir=tmp_path / "a").train()
    _train_epochs(Nitro(experiment, run_dir=tmp_path / "b"), 2)
    c = Nitro(experiment, run_dir=tmp_path / "b", resume="auto")
    _disturb(c)
    c.train()
    assert_same_state(a, c)


def test_draws_between_construction_and_train_do_not_move_a_fresh_run(tmp_path):
    a = Nitro(Scheduled(), run_dir=tmp_path / "a").train()
    b = Nitro(Scheduled(), run_dir=tmp_path / "b")
    _disturb(b)
    b.train()
    assert_same_state(a, b)


def test_validation_during_training_draws_nothing_from_the_trajectory(tmp_path):
    """A metric that draws random numbers must not change what training does."""

    class Draws(Scheduled):
        def loss(self, model, batch):
            if not model.training:
                torch.rand(5)
            return super().loss(model, batch)

    a = Nitro(Scheduled(), run_dir=tmp_path / "a").train()
    b = Nitro(Draws(), run_dir=tmp_path / "b").train()
    for (k, va), vb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(va, vb), k


def test_a_stale_handle_is_refused_and_writes_nothing(tmp_path):
    Nitro(KeepLast(max_epochs=2), run_dir=tmp_path).train()
    first = Nitro(KeepLast(max_epochs=4), run_dir=tmp_path, resume="auto")
    second = Nitro(KeepLast(max_epochs=4), run_dir=tmp_path, resume="auto")
    first.train()
    before = read_manifest(tmp_path)
    log = tmp_path / "logs" / f"{first.run_id}.jsonl"
    rows = log.read_bytes()
    with pytest.raises(TrainingRefused) as exc:
        second.train()
    latest = before[-1]
    assert str(exc.value) == (
        f"Run {first.run_id} in {str(tmp_path)!r} has moved on since this handle was built: the "
        f"handle is at epoch 2 (step 8), and the manifest now lists epoch 4 (step 16, "
        f"{latest.file!r}) written by another handle. Training from here would write those "
        "epochs twice under one run id. Build a new handle that continues from there: "
        f"Nitro(..., run_dir={str(tmp_path)!r}, resume='{first.run_id} => latest')."
    )
    assert read_manifest(tmp_path) == before and log.read_bytes() == rows


def test_building_a_resume_handle_touches_no_file_of_the_run(tmp_path):
    n = Nitro(KeepLast(max_epochs=2), run_dir=tmp_path).train()
    log = tmp_path / "logs" / f"{n.run_id}.jsonl"
    with log.open("ab") as f:  # a row another process is writing past the latest record
        f.write(b'{"epoch": 3}\n')
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    Nitro(KeepLast(max_epochs=3), run_dir=tmp_path, resume="auto")
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before


class GoesNaN(WithAcc):
    """The loss turns NaN at the 10th step (epoch 3, batch 2); 'acc' stays finite."""

    _steps: list[int] = PrivateAttr(default_factory=list)

    def loss(self, model, batch):
        self._steps.append(1)
        loss = super().loss(model, batch)
        return loss * float("nan") if len(self._steps) >= 10 else loss

    def checkpointer(self):
        return KeepLast().checkpointer()


def test_a_non_finite_loss_stops_the_run_before_anything_is_written(tmp_path):
    n = Nitro(GoesNaN(max_epochs=5), run_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NitroWarning)
        with pytest.raises(NonFiniteLoss) as exc:
            n.train()
    assert str(exc.value) == (
        "The training loss became non-finite at epoch 3, step 10 (batch 2 of the epoch): the run "
        "stopped before writing anything for epoch 3, and the records already on disk stay. "
        "Lower the learning rate, clip gradients or check the data, then continue from the last "
        "record with resume='auto'."
    )
    kept = read_manifest(tmp_path)
    assert [e.epoch for e in kept] == [1, 2]
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == sorted(e.file for e in kept)
