"""The fork server's reaping of its children (nitro_core.jobs.worker._reap), in-process with
``os.waitpid`` answering made-up wait statuses (no fork): a question whose process died gets
an empty answer, a job whose process ended without recording its end is recorded failed,
unless it was killed from outside or asked to stop (both left to the executor)."""

from __future__ import annotations

import os
import signal

import pytest

from nitro_core.jobs import worker
from nitro_core.jobs.files import JobStatus, job_dir, read_status, write_json

EXIT_1 = 1 << 8  # a wait status: exit code 1
KILLED = signal.SIGKILL  # a wait status: killed by SIGKILL
TERMED = signal.SIGTERM


@pytest.fixture
def ended(monkeypatch):
    """Make ``os.waitpid`` answer the given (pid, status) pairs, then (0, 0): none ended."""
    answers: list[tuple[int, int]] = []

    def waitpid(pid, options):
        assert pid == -1
        if answers:
            return answers.pop(0)
        assert options == os.WNOHANG, "a blocking wait with no child left"
        return 0, 0

    monkeypatch.setattr(worker.os, "waitpid", waitpid)
    return answers


def _job(tmp_path, name, **fields):
    directory = job_dir(tmp_path, name)
    directory.mkdir(parents=True)
    write_json(directory / "status.json", JobStatus(
        job_id=name, kind="validate", state="running", phase="validating", run_dir="runs/x",
        created="t", **fields,
    ))  # fmt: skip
    return directory


def test_a_question_whose_process_died_gets_an_empty_answer(tmp_path, ended):
    died, answered = tmp_path / "died.json", tmp_path / "answered.json"
    answered.write_bytes(b'{"splits": ["val"]}')
    ended += [(11, KILLED), (12, 0)]
    children = {11: ("probe", died), 12: ("probe", answered)}
    worker._reap(children, block=True)
    assert children == {}
    assert died.read_bytes() == b"{}"  # the server reads no answer, at once
    assert answered.read_bytes() == b'{"splits": ["val"]}'  # its own answer stays


def test_a_job_whose_process_ended_without_its_end_is_recorded_failed(tmp_path, ended):
    exited, termed = _job(tmp_path, "a"), _job(tmp_path, "b")
    ended += [(21, EXIT_1), (22, TERMED)]
    worker._reap({21: ("job", exited), 22: ("job", termed)}, block=True)
    status = read_status(exited)
    assert (status.state, status.phase, status.failure) == ("failed", "failed", "unexpected")
    assert status.error == (
        "The job's process ended (exit code 1) before it could record an end: the experiment's "
        "code ended it (os._exit, sys.exit, a crash). Its log holds what it printed."
    )
    assert status.ended is not None
    assert read_status(termed).error.startswith("The job's process ended (killed by signal 15) ")


def test_a_killed_job_and_one_asked_to_stop_are_left_to_the_executor(tmp_path, ended):
    killed = _job(tmp_path, "k")
    asked = _job(tmp_path, "s", stop_requested=True)
    done = _job(tmp_path, "d")
    write_json(done / "status.json", read_status(done).model_copy(update={"state": "succeeded"}))
    ended += [(31, KILLED), (32, EXIT_1), (33, EXIT_1)]
    worker._reap({31: ("job", killed), 32: ("job", asked), 33: ("job", done)}, block=True)
    assert read_status(killed).state == "running"  # the executor finds it lost
    assert read_status(asked).state == "running"  # the executor records it stopped
    assert read_status(asked).error is None
    assert read_status(done).state == "succeeded"  # its own end stays


def test_a_reap_that_does_not_wait_returns_while_children_run(tmp_path, ended):
    running = _job(tmp_path, "r")
    children = {41: ("job", running)}
    worker._reap(children, block=False)
    assert children == {41: ("job", running)}
    assert read_status(running).state == "running"
