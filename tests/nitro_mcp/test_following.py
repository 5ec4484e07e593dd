"""Following a job cheaply: progress inside an epoch (batch, recent loss, ETAs) written by
the worker about every two seconds and never per step, ``nitro_status(until='end')`` that
returns only at the job's end while progress notifications flow, ``brief=true`` replies,
the cheap call advised in ``next``, and the full reply's size bound."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core.jobs import JobManager
from nitro_core.jobs.call_models import TrainCall
from nitro_core.jobs.files import job_dir
from nitro_core.jobs.status import update_status, update_status_if
from nitro_core.training import progress as progress_module
from nitro_core.training.progress import Progress, Snapshot
from nitro_mcp.server import build_server

from .conftest import call

SLOW = "tests.nitro_mcp.slow_experiment"
BRIEF = {
    "job_id",
    "state",
    "epoch",
    "max_epochs",
    "step",
    "progress",
    "last_loss",
    "last_val",
    "next",
}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Loss:
    """Stands in for the loop's running loss sum on the device; counts host reads."""

    def __init__(self) -> None:
        self.value, self.reads = 0.0, 0

    def __float__(self) -> float:
        self.reads += 1
        return self.value


def test_progress_snapshots_are_throttled_to_every_two_seconds_never_per_step(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock)
    seen: list[Snapshot] = []
    bar = Progress(listener=seen.append)
    loss = Loss()
    for epoch in (1, 2):
        for done in range(1, 1001):  # 1000 steps of 10 ms: 10 s an epoch
            clock.now += 0.01
            loss.value += 0.5 if done <= 500 else 0.25  # the loss halves mid-epoch
            bar.update(epoch, 3, done, 1000, step=(epoch - 1) * 1000 + done, loss_sum=loss)
        loss.value = 0.0
        clock.now += 1.0  # validation and checkpoint
        bar.epoch_end(f"epoch {epoch}")
    inside = [s for s in seen if s.batch < 1000]
    assert 9 <= len(inside) <= 12  # every 2 s of 20 s, not 2000 steps
    assert loss.reads == len(inside)  # the running loss is read only for a snapshot
    first, mid = inside[0], inside[2]
    assert (first.epoch, first.batch, first.batches, first.step, first.loss) == (1, 1, 1000, 1, 0.5)
    assert first.epoch_eta_s is None and first.eta_s is None  # one step timed: no rate yet
    assert mid.loss == pytest.approx(0.5) and mid.epoch_eta_s == pytest.approx(
        (1000 - mid.batch) * 0.01, abs=0.1
    )
    late = [s for s in inside if s.epoch == 1 and s.batch > 700][0]
    assert late.loss == pytest.approx(0.25)  # the last seconds' mean, not the epoch's
    second = [s for s in inside if s.epoch == 2][-1]
    # the remaining epoch timed as long as the last whole one (its validation included)
    assert second.eta_s == pytest.approx(second.epoch_eta_s + 11.0, abs=0.2)
    ends = [s for s in seen if s.batch == 1000]
    assert [(s.epoch, s.epoch_eta_s) for s in ends] == [(1, 0.0), (2, 0.0)]
    assert ends[0].eta_s == pytest.approx(2 * 11.0, abs=0.2) and ends[1].eta_s == pytest.approx(
        11.0, abs=0.2
    )


def test_an_epoch_without_a_snapshot_sends_none_at_its_end(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock)
    seen: list[Snapshot] = []
    bar = Progress(listener=seen.append)
    bar.update(1, 2, 1, 4)  # the first step of the run: a snapshot
    clock.now += 0.1
    bar.epoch_end("epoch 1")  # closes that epoch's snapshot
    for done in range(1, 5):  # a fast epoch: no snapshot is due, none at its end either
        clock.now += 0.1
        bar.update(2, 2, done, 4)
    bar.epoch_end("epoch 2")
    assert [(s.epoch, s.batch) for s in seen] == [(1, 1), (1, 4)]


def slow_server(root: Path, monkeypatch, **kwargs):
    repo = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", repo)  # the worker imports the test module by name
    return build_server(root, experiment_modules=(SLOW,), **kwargs)


@pytest.mark.slow  # a real worker end to end; `pytest -m slow`
def test_following_a_run_shows_progress_inside_epochs_and_until_end_returns_once(
    tmp_path, monkeypatch
):
    async def main():
        async with Client(slow_server(tmp_path, monkeypatch)) as client:
            err, job = await call(
                client, "nitro_train", experiment="SlowSteps",
                overrides={"max_epochs": 2, "batch_size": 8},
            )  # fmt: skip
            assert not err, job
            job_id = job["job_id"]
            cheap = f"nitro_status(job_id='{job_id}', wait_s=25, until='end', brief=true)"
            assert cheap in job["next"]
            # inside an epoch (48 steps of 0.1 s): batch, loss and ETA, in a brief reply
            with anyio.fail_after(60):
                while True:
                    err, now = await call(client, "nitro_status", job_id=job_id, brief=True)
                    assert not err, now
                    p = now["progress"]
                    if p and p["eta_s"] is not None and p["batch"] < 48:
                        break
                    await anyio.sleep(0.2)
            assert set(now) == BRIEF and now["state"] == "running"
            assert now["epoch"] == p["epoch"] - 1 and now["step"] == now["epoch"] * 48 + p["batch"]
            assert p["batches"] == 48 and 1 < p["batch"] < 48 and isinstance(p["loss"], float)
            assert 0 < p["epoch_eta_s"] <= p["eta_s"] < 30 and p["age_s"] < 5
            assert cheap in now["next"]
            err, full = await call(client, "nitro_status", job_id=job_id)
            assert full["progress"] is not None and "log_tail" in full and "kept" in full
            # until='end': one call to the end; notifications inside epochs go forward
            notes = []

            async def on_progress(value, total, message):
                notes.append((value, total, message))

            with anyio.fail_after(300):  # one call each 25 s to the end, however slow the machine
                end = {"state": "running"}
                while end["state"] in ("queued", "running"):
                    result = await client.call_tool(
                        "nitro_status",
                        {"job_id": job_id, "wait_s": 25, "until": "end", "brief": True},
                        progress_callback=on_progress,
                    )
                    end = result.structured_content
            assert end["state"] == "succeeded" and end["epoch"] == 2, end
            assert set(end) == BRIEF and len(result.content[0].text) < 600
            values = [v for v, _, _ in notes]
            assert values == sorted(values) and all(t == 2.0 for _, t, _ in notes)
            assert any(0 < v % 1 for v in values), notes  # a fraction of an epoch
            assert any("batch" in m and "ETA" in m for _, _, m in notes), notes

    anyio.run(main)


@pytest.mark.slow  # a real worker killed or followed for epochs: `pytest -m slow`
def test_until_change_returns_at_the_next_epoch_end(tmp_path, monkeypatch):
    async def main():
        async with Client(slow_server(tmp_path, monkeypatch)) as client:
            err, job = await call(
                client, "nitro_train", experiment="SlowSteps",
                overrides={"max_epochs": 3, "step_s": 0.05},
            )  # fmt: skip
            with anyio.fail_after(60):
                first = {"epoch": 0}
                while first["epoch"] == 0:
                    err, first = await call(
                        client, "nitro_status", job_id=job["job_id"], wait_s=25, until="change"
                    )
                    assert not err, first
            assert first["state"] == "running" and first["epoch"] == 1, first
            await call(client, "nitro_stop", job_id=job["job_id"], force=True)

    anyio.run(main)


def test_a_bad_until_is_refused_with_the_values_to_write(tmp_path):
    async def main():
        async with Client(build_server(tmp_path, max_jobs=0)) as client:
            return await call(client, "nitro_status", job_id="20260101-000000-abcdef", until="done")

    err, text = anyio.run(main)
    assert err and text == (
        "Error executing tool nitro_status: until='done' is not a way to wait; write "
        "until='end' (return when the job ends or wait_s passes) or until='change' (also at "
        "each epoch's end)."
    )


def test_the_full_status_reply_stays_under_8000_characters(tmp_path):
    jobs = JobManager(tmp_path, max_jobs=0)
    job = jobs.submit(TrainCall(experiment="Regression", run_dir=str(tmp_path / "runs/r")))
    directory = job_dir(tmp_path, job.job_id)
    (directory / "log.txt").write_text("".join(f"line {i} " + "x" * 90 + "\n" for i in range(2000)))
    update_status_if(directory, {"queued"}, state="running", phase="training")
    update_status(directory, epoch=40, step=4000, last_val={f"m{i}": 0.5 for i in range(40)})
    update_status_if(
        directory, {"running"}, state="failed", phase="failed", error="e" * 2000, hint="h" * 500,
        result={"warnings": ["w" * 500] * 20, "kept": [f"epoch-{i:04d}.safetensors" for i in range(20)]},
    )  # fmt: skip

    async def main():
        async with Client(build_server(tmp_path, max_jobs=0)) as client:
            result = await client.call_tool("nitro_status", {"job_id": job.job_id})
            assert not result.is_error, result.content[0].text
            return result

    result = anyio.run(main)
    text = result.content[0].text
    assert len(text) < 8000, len(text)
    status = result.structured_content
    assert status["state"] == "failed" and status["error"] == "e" * 2000
    assert status["log_tail"].startswith("line ") and status["log_tail"].endswith("x\n")
    assert "line 1999 " in status["log_tail"]  # the end of the log is kept
    assert status["result"]["warnings_cut"].startswith("the last ")
    assert json.loads(text) == status
