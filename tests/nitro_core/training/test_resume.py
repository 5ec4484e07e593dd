"""Exact resume: run A == run B + run C (../shared/spec/resume-primer.txt)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from nitro_core import (
    EarlyStopping,
    Nitro,
    NitroWarning,
    Plateau,
    ResumeRefused,
    read_manifest,
)
from nitro_core.examples import Classifier, Regression

from ..tiny import KeepLast, Tiny


def assert_same_state(a: Nitro, c: Nitro) -> None:
    sa, sc = a.model.state_dict(), c.model.state_dict()
    assert sa.keys() == sc.keys()
    for k in sa:
        assert torch.equal(sa[k], sc[k]), k
    oa, oc = a.optimizer.state_dict(), c.optimizer.state_dict()
    assert oa["param_groups"] == oc["param_groups"]
    for i in oa["state"]:
        for k in oa["state"][i]:
            assert torch.equal(oa["state"][i][k], oc["state"][i][k]), (i, k)
    assert (a.step, a.epoch) == (c.step, c.epoch)
    assert [r["val"] for r in a.history] == [r["val"] for r in c.history]


class Scheduled(Tiny):
    """Every stateful collaborator at once: a scheduler over total steps, a plateau rule,
    early stopping and dropout drawing from the RNG."""

    def build_model(self):
        return torch.nn.Sequential(
            torch.nn.Linear(self.width, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)
        )

    def lr_scheduler(self, optimizer, total_steps):
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.05, total_steps=total_steps)

    def plateau(self):
        return Plateau(patience=1)

    def early_stopping(self):
        return EarlyStopping(patience=10)


@pytest.mark.parametrize(
    "experiment", [Classifier(samples=256), Regression(samples=256), Scheduled()]
)
def test_resume_continues_bit_for_bit(tmp_path, experiment):
    a = Nitro(experiment.model_copy(update={"max_epochs": 4}), run_dir=tmp_path / "a").train()
    b = Nitro(experiment.model_copy(update={"max_epochs": 4}), run_dir=tmp_path / "b")
    b_two = _train_epochs(b, 2)  # B stops after two epochs, as a requested stop
    c = Nitro(
        experiment.model_copy(update={"max_epochs": 4}), run_dir=tmp_path / "b", resume="auto"
    )
    assert (c.run_id, c.epoch, c.step) == (b_two.run_id, 2, b_two.step)
    c.train()
    assert_same_state(a, c)
    if a.ema is not None:
        for k in a.ema.shadow:
            assert torch.equal(a.ema.shadow[k], c.ema.shadow[k]), k
    log_a = (tmp_path / "a" / "logs" / f"{a.run_id}.jsonl").read_text().splitlines()
    log_c = (tmp_path / "b" / "logs" / f"{c.run_id}.jsonl").read_text().splitlines()
    strip = [
        {k: v for k, v in json.loads(line).items() if k not in ("run", "seconds")}
        for line in (*log_a, *log_c)
    ]
    assert strip[:4] == strip[4:]


def _train_epochs(n: Nitro, epochs: int) -> Nitro:
    """Train ``epochs`` epochs, then stop as a user would (request_stop during the last one)."""
    original = n.experiment.loss

    def loss(model, batch):
        if model.training and n.epoch == epochs - 1:
            n.request_stop()
        return original(model, batch)

    object.__setattr__(n.experiment, "loss", loss)
    n.train()
    assert (n.epoch, n.stop_reason) == (epochs, "requested")
    return n


def test_max_epochs_may_be_raised_on_resume(tmp_path):
    a = Nitro(Regression(max_epochs=4, samples=256), run_dir=tmp_path / "a").train()
    b = Nitro(Regression(max_epochs=2, samples=256), run_dir=tmp_path / "b").train()
    c = Nitro(Regression(max_epochs=4, samples=256), run_dir=tmp_path / "b", resume="auto").train()
    assert c.run_id == b.run_id
    assert_same_state(a, c)
    entries = read_manifest(tmp_path / "b")
    assert {e.run for e in entries} == {b.run_id}
    assert [e.stop_reason for e in entries if e.epoch in (2, 4)] == ["completed", "completed"]


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_resume_in_a_new_process_equals_the_uninterrupted_run(tmp_path):
    a = Nitro(Classifier(max_epochs=4, samples=256), run_dir=tmp_path / "a").train()
    Nitro(Classifier(max_epochs=2, samples=256), run_dir=tmp_path / "b").train()
    script = textwrap.dedent(
        f"""
        import torch
        from safetensors.torch import save_file
        from nitro_core import Nitro
        from nitro_core.examples import Classifier
        torch.set_num_threads(1)  # as in this process: CPU kernels reduce in thread order
        c = Nitro(Classifier(max_epochs=4, samples=256), run_dir={str(tmp_path / "b")!r}, resume="auto").train()
        state = {{"model/" + k: v for k, v in c.model.state_dict().items()}}
        for i, s in c.optimizer.state_dict()["state"].items():
            state.update({{f"optim/{{i}}/{{k}}": v for k, v in s.items()}})
        save_file({{k: v.contiguous() for k, v in state.items()}}, {str(tmp_path / "c.safetensors")!r})
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=600, cwd=tmp_path)
    from safetensors.torch import load_file

    c = load_file(tmp_path / "c.safetensors")
    for k, v in a.model.state_dict().items():
        assert torch.equal(v, c[f"model/{k}"]), k
    for i, s in a.optimizer.state_dict()["state"].items():
        for k, v in s.items():
            assert torch.equal(v, c[f"optim/{i}/{k}"]), (i, k)


def test_a_changed_plain_field_refuses_with_a_diff(tmp_path):
    Nitro(Regression(max_epochs=1, samples=256), run_dir=tmp_path).train()
    (entry,) = [e for e in read_manifest(tmp_path) if e.stop_reason]
    with pytest.raises(ResumeRefused) as exc:
        Nitro(
            Regression(max_epochs=3, samples=256, hidden=16, lr=0.1),
            run_dir=tmp_path,
            resume="auto",
        )
    assert str(exc.value) == (
        f"Cannot resume {str(tmp_path / entry.file)!r}: the config changed since it was recorded:\n"
        "  hidden: 32 -> 16\n"
        "  lr: 0.01 -> 0.1\n"
        "Plain fields must match for an exact resume (Host fields may change). Resume with "
        "Regression(max_epochs=1, features=8, hidden=32, samples=256, batch_size=64, lr=0.01), or "
        "start a new run that takes only the weights: Nitro(exp, weights=...)."
    )


def test_resume_auto_on_an_empty_directory_warns_and_starts_fresh(tmp_path):
    with pytest.warns(NitroWarning) as caught:
        n = Nitro(Tiny(), run_dir=tmp_path / "empty", resume="auto")
    assert str(caught[0].message) == (
        f"resume='auto' found nothing to resume in {str(tmp_path / 'empty')!r}; starting a fresh run."
    )
    assert (n.epoch, n.step, n.checkpoint_source) == (0, 0, None)


def test_resume_restores_the_recorded_seed_over_the_keyword(tmp_path):
    Nitro(KeepLast(max_epochs=1), run_dir=tmp_path, seed=5).train()
    with pytest.warns(
        UserWarning, match="seed=9 ignored: resuming .* restores its recorded seed 5"
    ):
        n = Nitro(KeepLast(max_epochs=2), run_dir=tmp_path, seed=9, resume="auto")
    assert n.seed == 5 and n.checkpoint_source is not None


def test_resume_warns_when_the_thread_count_differs_from_the_record(tmp_path):
    Nitro(KeepLast(max_epochs=1), run_dir=tmp_path).train()
    torch.set_num_threads(2)
    with pytest.warns(
        NitroWarning, match=r"written with torch.get_num_threads\(\)=1, this process has 2"
    ):
        Nitro(KeepLast(max_epochs=2), run_dir=tmp_path, resume="auto")


def test_resume_truncates_log_lines_written_after_the_record(tmp_path):
    n = Nitro(KeepLast(max_epochs=2), run_dir=tmp_path).train()
    log = tmp_path / "logs" / f"{n.run_id}.jsonl"
    with open(log, "a") as f:
        f.write('{"epoch": 3, "partial": true}\n')  # written by a run killed before its record
    Nitro(KeepLast(max_epochs=3), run_dir=tmp_path, resume="auto").train()
    assert [json.loads(line)["epoch"] for line in log.read_text().splitlines()] == [1, 2, 3]
