"""Setup refusals and warnings found in review: each names the value and what to write."""

from __future__ import annotations

import os

import pytest
import torch

from nitro_core import (
    Best,
    Checkpointer,
    CheckpointMissing,
    ConfigError,
    Every,
    Nitro,
    NitroWarning,
    TensorBatches,
    read_manifest,
)
from tests.nitro_core.sources.test_loading import Anchored

from ..tiny import KeepLast, Tiny


class RanksByAcc(Tiny):
    def checkpointer(self):
        return Checkpointer(metric="acc", mode="max")


def test_ranking_by_a_metric_validation_cannot_report_is_refused_at_setup(tmp_path):
    with pytest.raises(ConfigError) as exc:
        Nitro(RanksByAcc(), run_dir=tmp_path)
    assert str(exc.value) == (
        "RanksByAcc ranks by 'acc', but it defines no metrics(), so validation reports only 'loss'. "
        "Define metrics() returning 'acc' (name -> (sum, count)), or rank by ('loss', 'min')."
    )


def test_a_metric_name_that_cannot_be_a_file_name_is_refused(tmp_path):
    class Slashed(Tiny):
        def metrics(self, model, batch):
            return {"acc/top1": (1.0, 1.0)}

        def monitor(self):
            return ("acc/top1", "max")

    with pytest.raises(
        ConfigError,
        match=r"Slashed.monitor\(\) names the metric 'acc/top1'; metric names take letters",
    ):
        Nitro(Slashed(), run_dir=tmp_path)
    with pytest.raises(
        ConfigError, match=r"Checkpointer\(name='../escaped'\): a file-name prefix takes letters"
    ):
        Checkpointer(name="../escaped")


def test_a_keep_without_last_warns_that_epochs_may_go_unwritten(tmp_path):
    class Sparse(Tiny):
        def checkpointer(self):
            return Checkpointer(keep=(Best(1), Every(10)))

    with pytest.warns(
        NitroWarning,
        match=r"keep=\(Best\(1\), Every\(10\)\) has no Last, so an epoch is written only when a selector keeps it",
    ):
        Nitro(Sparse(), run_dir=tmp_path)


def test_decay_anchor_and_seed_are_checked(tmp_path):
    class Typo(Tiny):
        def decay_anchor(self):
            return "w_0"

    with pytest.raises(
        ConfigError, match=r"Typo.decay_anchor\(\) returned 'w_0'; return 'zero' or 'w0'."
    ):
        Nitro(Typo(), run_dir=tmp_path)
    for seed in (-1, 2**80, "7", True):
        with pytest.raises(
            ConfigError, match=r"is not a seed; write an integer from 0 to 2\*\*63 - 1"
        ):
            Nitro(Tiny(), run_dir=tmp_path, seed=seed)
    with pytest.raises(ConfigError, match=r"strict='false' must be True or False."):
        Nitro(Tiny(), run_dir=tmp_path, strict="false")
    with pytest.raises(
        ConfigError, match=r"TensorBatches\(batch_size=0\): write a positive integer"
    ):
        TensorBatches({"x": torch.zeros(4)}, 0)


def test_w0_anchor_with_a_schedule_resumes_exactly(tmp_path):
    class Decaying(Anchored):
        def lr_scheduler(self, optimizer, total_steps):
            return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))

    a = Nitro(Decaying(max_epochs=4), run_dir=tmp_path / "a").train()
    Nitro(Decaying(max_epochs=2), run_dir=tmp_path / "b").train()
    c = Nitro(Decaying(max_epochs=4), run_dir=tmp_path / "b", resume="auto").train()
    assert torch.equal(a.model.weight, c.model.weight) and torch.equal(a.model.bias, c.model.bias)


def test_a_listed_record_missing_from_disk_names_it(tmp_path):
    Nitro(KeepLast(max_epochs=2), run_dir=tmp_path).train()
    latest = read_manifest(tmp_path)[-1]
    os.unlink(tmp_path / latest.file)
    with pytest.raises(CheckpointMissing) as exc:
        Nitro(KeepLast(max_epochs=3), run_dir=tmp_path, resume="auto")
    assert str(exc.value) == (
        f"Checkpoint file {str(tmp_path / latest.file)!r} is not on disk (deleted, or evicted by "
        "retention since it was named); read_manifest lists the records a run directory holds now."
    )
    assert isinstance(exc.value, FileNotFoundError)


def test_a_moved_aside_partial_file_is_never_a_source(tmp_path):
    Nitro(KeepLast(max_epochs=1), run_dir=tmp_path).train()
    stale = tmp_path / "epoch-0002-step-8-loss=1.safetensors.tmp.stale"
    stale.write_bytes(b"partial")
    with pytest.raises(ConfigError, match="is a partial file left by an interrupted write"):
        Nitro(KeepLast(), run_dir=tmp_path, weights=stale)


def test_one_run_is_trained_by_one_process_at_a_time(tmp_path):
    from nitro_core import TrainingRefused
    from nitro_core.store import recordio as store

    first = Nitro(KeepLast(max_epochs=2), run_dir=tmp_path).train()
    second = Nitro(KeepLast(max_epochs=3), run_dir=tmp_path, resume="auto")
    assert second.run_id == first.run_id
    with store.run_lock(tmp_path, first.run_id) as mine:  # as if another process were training it
        assert mine
        with pytest.raises(
            TrainingRefused,
            match=rf"Run {first.run_id} in .* is being trained by another process right now",
        ):
            second.train()
    assert second.train().epoch == 3
