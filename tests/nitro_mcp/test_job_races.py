"""Job races, played in their racing order: a worker's result is never overwritten by the
server (a late launch record, a forced stop), terminal states are final, a stop is a flag
read at safe points (SIGTERM never raises into running code), and queued jobs start with
no client connected."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core.jobs import JobManager
from nitro_core.jobs import local as local_module
from nitro_core.jobs.call_models import TrainCall
from nitro_core.jobs.files import job_dir, process_start, read_status
from nitro_core.jobs.status import update_status, update_status_if
from nitro_core.jobs.worker import _end, _Stop, _StoppedEarly
from nitro_mcp.server import build_server

from .conftest import call

TINY = {"max_epochs": 1, "samples": 64}


def queued_job(root: Path) -> tuple[JobManager, str, Path]:
    """A job that stays queued (no slot), so each test plays the race by hand."""
    jobs = JobManager(root, max_jobs=0)
    job = jobs.submit(TrainCall(experiment="Regression", run_dir=str(root / "runs/r")))
    assert job.state == "queued"
    return jobs, job.job_id, job_dir(root, job.job_id)


def test_a_fast_workers_result_is_not_overwritten_by_the_launch_record(tmp_path, monkeypatch):
    jobs, job_id, directory = queued_job(tmp_path)

    class FastWorker:
        """Starts, fails and records it before Popen has even returned to the server."""

        def __init__(self, args, **kwargs):
            assert Path(args[-1]) == directory
            update_status_if(directory, {"running"}, phase="starting", pid=4_000_000)
            _end(directory, "failed", phase="failed", error="boom", hint="fix it")
            self.pid = 4_000_001

        def poll(self):
            return 1

    monkeypatch.setattr(local_module.subprocess, "Popen", FastWorker)
    jobs.max_jobs = 1
    jobs.local.launch(job_id)
    status = read_status(directory)
    assert (status.state, status.phase, status.error, status.pid) == (
        "failed",
        "failed",
        "boom",
        4_000_000,
    )


def test_a_launch_record_before_the_worker_reports_sets_the_pid(tmp_path, monkeypatch):
    jobs, job_id, directory = queued_job(tmp_path)

    class SlowWorker:
        def __init__(self, args, **kwargs):
            self.pid = 4_000_002

        def poll(self):
            return None

    monkeypatch.setattr(local_module.subprocess, "Popen", SlowWorker)
    jobs.max_jobs = 1
    jobs.local.launch(job_id)
    status = read_status(directory)
    assert (status.state, status.phase, status.pid) == ("running", "starting", 4_000_002)


def test_a_forced_stop_keeps_a_result_recorded_just_before_the_kill(tmp_path, monkeypatch):
    jobs, job_id, directory = queued_job(tmp_path)
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)  # stands in for a worker
    try:
        update_status_if(
            directory, {"queued"}, state="running", phase="training",
            pid=sleeper.pid, pid_start=process_start(sleeper.pid),
        )  # fmt: skip
        real_killpg = local_module.os.killpg

        def worker_finishes_first(pid, sig):
            _end(directory, "succeeded", phase="done", result={"run_id": "r1"})
            real_killpg(pid, sig)

        monkeypatch.setattr(local_module.os, "killpg", worker_finishes_first)
        returned = jobs.stop(job_id, force=True)
    finally:
        sleeper.kill()
        sleeper.wait()
    status = read_status(directory)
    assert (returned.state, status.state, status.phase, status.result) == (
        "succeeded",
        "succeeded",
        "done",
        {"run_id": "r1"},
    )
    events = (directory / "events.jsonl").read_text()
    assert '"event": "succeeded"' in events and '"event": "stopped"' not in events


def test_terminal_states_are_final(tmp_path):
    jobs, job_id, directory = queued_job(tmp_path)
    assert update_status_if(directory, {"queued"}, state="running") is not None
    _end(directory, "succeeded", phase="done", result={"ok": 1})
    assert update_status_if(directory, {"running"}, state="lost", phase="lost") is None
    assert update_status(directory, phase="training", epoch=3).phase == "done"
    _end(directory, "failed", phase="failed", error="late")
    status = read_status(directory)
    assert (status.state, status.phase, status.epoch, status.error, status.result) == (
        "succeeded",
        "done",
        0,
        None,
        {"ok": 1},
    )


def test_sigterm_sets_a_flag_and_never_raises_into_running_code(tmp_path):
    jobs, job_id, directory = queued_job(tmp_path)
    stop = _Stop(directory)
    stop.handle(signal.SIGTERM, None)  # before the handle exists: it used to raise here
    assert stop.requested
    with pytest.raises(_StoppedEarly):
        stop.check()  # the next safe point stops, touching nothing


def test_a_stop_flag_set_by_the_server_is_read_at_the_next_safe_point(tmp_path):
    jobs, job_id, directory = queued_job(tmp_path)
    update_status_if(directory, {"queued"}, state="running", phase="setup")
    stop = _Stop(directory)
    stop.check()  # nothing asked yet
    update_status(directory, stop_requested=True)  # the server lost the race to signal it
    with pytest.raises(_StoppedEarly):
        stop.check()


def test_a_stop_during_training_becomes_a_graceful_request_on_the_handle(tmp_path, monkeypatch):
    monkeypatch.setattr("nitro_core.jobs.worker.WATCH_S", 0.01)
    jobs, job_id, directory = queued_job(tmp_path)
    requested = threading.Event()

    class Handle:
        def request_stop(self):
            requested.set()

    stop = _Stop(directory)
    stop.handle_ref = Handle()
    stop.watch()
    try:
        assert not requested.wait(0.1)
        stop.handle(signal.SIGTERM, None)
        assert requested.wait(60)  # polled every 10 ms: a loaded machine only delays it
    finally:
        stop.done.set()  # the watcher thread ends with the test, as with its job


def wait_for_state(directory: Path, states: set[str], limit: float) -> dict:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        status = json.loads((directory / "status.json").read_text())
        if status["state"] in states:
            return status
        time.sleep(0.2)
    raise AssertionError(f"{directory.name} is still {status['state']} after {limit} s")


@pytest.mark.slow  # a real worker end to end; `pytest -m slow`
def test_queued_jobs_run_after_the_client_disconnects(tmp_path):
    async def main():
        async with Client(build_server(tmp_path, max_jobs=1)) as client:
            err, a = await call(
                client, "nitro_train", experiment="Regression", run_dir="runs/a", overrides=TINY
            )
            assert not err, a
            err, b = await call(
                client, "nitro_train", experiment="Regression", run_dir="runs/b", overrides=TINY
            )
            assert not err and b["state"] == "queued", b
        return a["job_id"], b["job_id"]  # disconnected: no call, no watcher from here on

    first, second = anyio.run(main)
    jobs = tmp_path / ".nitro" / "jobs"
    assert wait_for_state(jobs / first, {"succeeded", "failed"}, 120)["state"] == "succeeded"
    done = wait_for_state(jobs / second, {"succeeded", "failed"}, 120)
    assert done["state"] == "succeeded" and done["run_id"], done


@pytest.mark.slow  # a real worker end to end; `pytest -m slow`
def test_the_server_starts_a_queued_job_without_any_call(tmp_path):
    other = JobManager(tmp_path, max_jobs=0)  # another server queued it and went away
    job = other.submit(TrainCall(experiment="Regression", run_dir=str(tmp_path / "runs/r"),
                                 overrides=TINY))  # fmt: skip

    async def main():
        async with Client(build_server(tmp_path, max_jobs=1)):
            with anyio.fail_after(30):
                while read_status(job_dir(tmp_path, job.job_id)).state == "queued":
                    await anyio.sleep(0.2)

    anyio.run(main)
    done = wait_for_state(job_dir(tmp_path, job.job_id), {"succeeded", "failed"}, 120)
    assert done["state"] == "succeeded", done
