"""The handle: setup refusals, training, stopping, logging and what each epoch writes."""

from __future__ import annotations

import json
import signal
import warnings
from typing import ClassVar

import pytest
import torch

from nitro_core import (
    Best,
    Checkpointer,
    ConfigError,
    EarlyStopping,
    Last,
    MonitorError,
    Nitro,
    NitroWarning,
    Plateau,
    checkpoint_info,
    checkpoint_run,
    read_manifest,
)

from ..tiny import BestOnly, KeepLast, NoVal, Tiny, WithAcc


def test_train_returns_the_handle_with_history_step_and_epoch(tmp_path):
    n = Nitro(Tiny(), run_dir=tmp_path)
    assert n.train() is n
    assert (n.epoch, n.step, n.stop_reason) == (3, 12, "completed")
    assert [row["epoch"] for row in n.history] == [1, 2, 3]
    assert set(n.history[0]) == {"epoch", "step", "train_loss", "lr", "val", "seconds"}
    assert set(n.history[0]["val"]) == {"loss"}
    assert checkpoint_run(n) == n.run_id and len(n.run_id) == 8
    assert n.validate() == n.history[-1]["val"]


def test_default_run_dir_is_runs_slash_the_experiment_name(tmp_path):
    n = Nitro(Tiny(max_epochs=1)).train()
    assert n.run_dir.as_posix() == "runs/Tiny" and (tmp_path / "runs/Tiny/manifest.json").exists()


def test_jsonl_logger_writes_one_line_per_epoch_in_the_run_directory(tmp_path):
    n = Nitro(Tiny(), run_dir=tmp_path).train()
    lines = (tmp_path / "logs" / f"{n.run_id}.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["epoch"] for r in rows] == [1, 2, 3] and {r["run"] for r in rows} == {n.run_id}
    assert rows[-1]["val"] == n.history[-1]["val"]


def test_the_same_seed_trains_the_same_weights_and_another_seed_does_not(tmp_path):
    a = Nitro(Tiny(), run_dir=tmp_path / "a", seed=7).train()
    b = Nitro(Tiny(), run_dir=tmp_path / "b", seed=7).train()
    c = Nitro(Tiny(), run_dir=tmp_path / "c", seed=8).train()
    assert torch.equal(a.model.weight, b.model.weight)
    assert not torch.equal(a.model.weight, c.model.weight)


def test_checkpointer_none_writes_nothing(tmp_path):
    class NoCkpt(Tiny):
        def checkpointer(self):
            return None

    Nitro(NoCkpt(), run_dir=tmp_path).train()
    assert not (tmp_path / "manifest.json").exists()
    assert not list(tmp_path.glob("*.safetensors"))


def test_default_keep_is_best_three_plus_the_latest(tmp_path):
    n = Nitro(Tiny(max_epochs=6, lr=0.5), run_dir=tmp_path).train()
    entries = read_manifest(tmp_path)
    scores = {row["epoch"]: row["val"]["loss"] for row in n.history}
    best3 = sorted(scores, key=scores.get)[:3]
    assert sorted(e.epoch for e in entries) == sorted(set(best3) | {6})
    assert all(e.file.startswith(f"epoch-{e.epoch:04d}-step-{e.step}-loss=") for e in entries)


def test_file_name_follows_the_documented_pattern(tmp_path):
    Nitro(KeepLast(max_epochs=1), run_dir=tmp_path).train()
    (entry,) = read_manifest(tmp_path)
    assert entry.file == f"epoch-0001-step-4-loss={entry.score:.6g}.safetensors"


def test_records_without_val_have_no_score(tmp_path):
    Nitro(NoVal(max_epochs=2), run_dir=tmp_path).train()
    (entry,) = read_manifest(tmp_path)
    assert (entry.epoch, entry.score, entry.file) == (2, None, "epoch-0002-step-8.safetensors")


# -- setup refusals and warnings ---------------------------------------------------------------
class MetricsNoMonitor(Tiny):
    def metrics(self, model, batch):
        return {"acc": (1.0, 1.0)}


def test_best_with_nothing_to_rank_by_is_refused_at_setup(tmp_path):
    with pytest.raises(ConfigError) as exc:
        Nitro(MetricsNoMonitor(), run_dir=tmp_path)
    assert str(exc.value) == (
        "MetricsNoMonitor has nothing to rank by for keep=(Best(3), Last(1)): it defines metrics() "
        "without declaring monitor(), and eval_loss() is off, so no 'loss' is reported. Declare "
        "def monitor(self): return ('acc', 'max') with a key finalize_metrics returns, turn on "
        "def eval_loss(self): return True, or keep only Last(k): Checkpointer(keep=Last(1))."
    )


def test_last_only_needs_no_metric(tmp_path):
    class LastOnly(MetricsNoMonitor):
        def checkpointer(self):
            return Checkpointer(keep=Last(1))

    Nitro(LastOnly(max_epochs=2), run_dir=tmp_path).train()
    (entry,) = read_manifest(tmp_path)
    assert (entry.epoch, entry.metric, entry.mode, entry.score) == (2, None, None, None)


def test_best_only_keep_without_a_val_split_is_refused(tmp_path):
    class BestNoVal(NoVal):
        def checkpointer(self):
            return Checkpointer(keep=Best(3))

    with pytest.raises(ConfigError) as exc:
        Nitro(BestNoVal(), run_dir=tmp_path)
    assert str(exc.value) == (
        "BestNoVal keeps only (Best(3)) but build_data() has no 'val' split, so no epoch would have "
        "a score and nothing would be written. Add a 'val' split, or keep the latest too: "
        "Checkpointer(keep=(Best(3), Last(1)))."
    )


def test_a_best_beside_a_last_without_a_val_split_warns_at_construction(tmp_path):
    """It trains and keeps the latest, but every score is null: a best is never kept, and
    nothing used to say so (issue 38)."""

    class BestAndLastNoVal(NoVal):
        def checkpointer(self):
            return Checkpointer(keep=(Best(3), Last(2)))

    with pytest.warns(NitroWarning) as caught:
        Nitro(BestAndLastNoVal(), run_dir=tmp_path)
    said = [str(w.message) for w in caught]
    assert (
        "BestAndLastNoVal keeps Best(3) but build_data() has no 'val' split, so no record gets "
        "a score: it keeps no best, and restore_best and 'best' sources find none. Add a 'val' "
        "split, or keep only the latest: Checkpointer(keep=Last(2))."
    ) in said, said
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same keep with a 'val' split: not a word
        Nitro(KeepLastAndBest(), run_dir=tmp_path / "with-val")


class KeepLastAndBest(Tiny):
    def checkpointer(self):
        return Checkpointer(keep=(Best(3), Last(2)))


def test_best_only_keep_warns_that_the_final_state_may_not_be_saved(tmp_path):
    with pytest.warns(NitroWarning) as caught:
        Nitro(BestOnly(), run_dir=tmp_path)
    assert str(caught[0].message).startswith(
        "keep=(Best(2)) writes an epoch only when it enters the top 2: the state training ends in is saved only if it ranks"
    )
    assert str(caught[0].message).endswith(
        "Add Last(1) to keep the latest: Checkpointer(keep=(Best(2), Last(1)))."
    )


def test_best_only_writes_only_epochs_that_rank(tmp_path):
    with pytest.warns(NitroWarning):
        n = Nitro(BestOnly(max_epochs=5, lr=0.5), run_dir=tmp_path)
    n.train()
    scores = {row["epoch"]: row["val"]["loss"] for row in n.history}
    kept = sorted(scores, key=scores.get)[:2]
    assert sorted(e.epoch for e in read_manifest(tmp_path)) == sorted(kept)


def test_a_monitor_that_validation_does_not_return_raises_after_the_first_epoch(tmp_path):
    class Misnamed(WithAcc):
        def monitor(self):
            return ("val_acc", "max")

    n = Nitro(Misnamed(), run_dir=tmp_path)
    with pytest.raises(MonitorError) as exc:
        n.train()
    assert str(exc.value) == (
        "Monitored metric 'val_acc' is not a key finalize_metrics returned for 'val' at the end of "
        "epoch 1; it returned: acc. Names carry no split: write 'acc'. Return 'val_acc' from "
        "Misnamed.metrics()/finalize_metrics(), or declare monitor() (or Checkpointer(metric=, mode=)) "
        "with one of the returned keys."
    )
    assert n.epoch == 1 and not (tmp_path / "manifest.json").exists()


def test_custom_metric_ranks_checkpoints(tmp_path):
    n = Nitro(WithAcc(max_epochs=3), run_dir=tmp_path).train()
    assert set(n.history[0]["val"]) == {"acc"}
    assert {(e.metric, e.mode) for e in read_manifest(tmp_path)} == {("acc", "max")}


def test_bad_device_is_refused(tmp_path):
    with pytest.raises(ConfigError) as exc:
        Nitro(Tiny(), run_dir=tmp_path, device="gpu-please")
    assert str(exc.value) == "device='gpu-please' is not a device; write 'auto', 'cpu' or 'cuda:0'."


def test_evaluate_on_a_missing_split_names_the_splits(tmp_path):
    n = Nitro(Tiny(), run_dir=tmp_path)
    with pytest.raises(ConfigError) as exc:
        n.evaluate("test")
    assert str(exc.value) == (
        "Tiny.build_data() has no 'test' split; it has train, val. Return 'test' from build_data() "
        "or evaluate one of those."
    )


# -- stopping ---------------------------------------------------------------------------------
class Stalled(Tiny):
    lr: float = 0.0

    def early_stopping(self):
        return EarlyStopping(patience=2)


def test_early_stopping_stops_and_records_early_stop(tmp_path):
    n = Nitro(Stalled(max_epochs=10), run_dir=tmp_path).train()
    assert (n.epoch, n.stop_reason) == (3, "early_stop")
    final = read_manifest(tmp_path)[-1]
    assert (final.epoch, final.stop_reason) == (3, "early_stop")
    assert checkpoint_info(tmp_path / final.file)["stop_reason"] == "early_stop"


def test_plateau_reduces_the_learning_rate_when_the_monitor_stalls(tmp_path):
    class Flat(Tiny):
        lr: float = 1e-6

        def plateau(self):
            return Plateau(factor=0.5, patience=1)

    n = Nitro(Flat(max_epochs=4), run_dir=tmp_path).train()
    assert [row["lr"] for row in n.history] == [1e-6, 1e-6, 5e-7, 5e-7]


class StopHook(Tiny):
    """Calls ``trigger`` once, during a training step of the second epoch."""

    trigger: ClassVar[list] = []

    def loss(self, model, batch):
        if model.training and self.trigger and self.trigger[0]():
            self.trigger.clear()
        return super().loss(model, batch)


def _in_epoch_2(n, action):
    return lambda: n.epoch == 1 and (action() or True)


def test_request_stop_finishes_the_epoch_and_records_requested(tmp_path):
    n = Nitro(StopHook(max_epochs=5), run_dir=tmp_path)
    StopHook.trigger[:] = [_in_epoch_2(n, n.request_stop)]
    n.train()
    assert (n.epoch, n.step, n.stop_reason) == (2, 8, "requested")
    final = read_manifest(tmp_path)[-1]
    assert (final.epoch, final.stop_reason) == (2, "requested")
    assert checkpoint_info(tmp_path / final.file)["stop_reason"] == "requested"


def test_ctrl_c_stops_gracefully_after_the_epoch(tmp_path):
    n = Nitro(StopHook(max_epochs=5), run_dir=tmp_path)
    StopHook.trigger[:] = [_in_epoch_2(n, lambda: signal.raise_signal(signal.SIGINT))]
    before = signal.getsignal(signal.SIGINT)
    n.train()
    assert (n.epoch, n.stop_reason) == (2, "requested")
    assert read_manifest(tmp_path)[-1].stop_reason == "requested"
    assert signal.getsignal(signal.SIGINT) is before


# -- several runs in one directory ----------------------------------------------------------------
def test_a_name_that_would_land_on_another_runs_file_gets_the_run_id(tmp_path):
    a = Nitro(KeepLast(), run_dir=tmp_path).train()
    b = Nitro(KeepLast(), run_dir=tmp_path).train()
    a_files = [e.file for e in read_manifest(tmp_path) if e.run == a.run_id]
    b_files = [e.file for e in read_manifest(tmp_path) if e.run == b.run_id]
    assert len(a_files) == 2
    assert [f.replace(f"-run-{b.run_id}", "") for f in b_files] == a_files
    assert all(f"-run-{b.run_id}.safetensors" in f for f in b_files)
    for e in read_manifest(tmp_path):
        assert checkpoint_info(tmp_path / e.file)["run"] == e.run


def test_scope_dir_warns_then_ranks_across_runs(tmp_path):
    class DirScoped(Tiny):
        def checkpointer(self):
            return Checkpointer(keep=(Best(1), Last(1)), scope="dir")

    first = Nitro(DirScoped(max_epochs=2, lr=0.5), run_dir=tmp_path).train()
    with pytest.warns(NitroWarning, match="with scope='dir' this run's writes may delete them"):
        second = Nitro(DirScoped(max_epochs=2, lr=0.01), run_dir=tmp_path, seed=3)
    second.train()
    entries = read_manifest(tmp_path)
    assert len(entries) <= 2 and entries[-1].run == second.run_id
    best = min(row["val"]["loss"] for h in (first.history, second.history) for row in h)
    assert any(e.score == pytest.approx(best) for e in entries)


def test_mixed_metrics_in_a_directory_warn_and_are_never_deleted(tmp_path):
    class LossDir(Tiny):
        def checkpointer(self):
            return Checkpointer(keep=Last(1), scope="dir")

    class AccDir(WithAcc):
        def checkpointer(self):
            return Checkpointer(keep=Last(1), scope="dir")

    old = Nitro(LossDir(max_epochs=1), run_dir=tmp_path).train()
    with pytest.warns(
        NitroWarning,
        match=r"holds entries scored under other metrics \(loss \(min\) x1\) beside acc \(max\)",
    ):
        new = Nitro(AccDir(max_epochs=2), run_dir=tmp_path)
    new.train()
    assert [(e.run, e.metric) for e in read_manifest(tmp_path)] == [
        (old.run_id, "loss"),
        (new.run_id, "acc"),
    ]


# -- progress (the bar and the plain lines: test_progress.py) ----------------------------------
def test_training_prints_nothing_to_stdout(tmp_path, capfd):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Nitro(Tiny(), run_dir=tmp_path).train()
    assert capfd.readouterr().out == ""
