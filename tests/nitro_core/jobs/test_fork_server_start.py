"""Where the fork server (the warm worker, nitro_core.jobs.local) starts: in the root, with
the environment a job's worker of its own gets, whatever the server's own working directory
and environment are, so a job runs the same warm and cold. Read from ``/proc`` of the real
process the moment it starts (the server's cwd is the root in the end-to-end tests, so they
cannot tell), then killed before it has imported anything."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from nitro_core.jobs.local import LocalExecutor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture
def fork_server(tmp_path, monkeypatch):
    """The executor's fork server, started from a server whose cwd is not the root and whose
    environment lacks what a worker's holds; yields its pid."""
    root = tmp_path / "root"
    (root / ".nitro").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # the server's own cwd
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    monkeypatch.setenv("NITRO_SERVER_ONLY", "kept")  # the server's environment reaches it too
    executor = LocalExecutor(root, pump=lambda: None, warm=True)
    executor._warm = executor._start_warm()
    try:
        yield root, executor._warm.pid
    finally:
        executor._drop_warm()  # SIGKILL to its process group, waited for


def test_the_fork_server_runs_in_the_root_not_the_servers_directory(fork_server):
    root, pid = fork_server
    assert os.readlink(f"/proc/{pid}/cwd") == str(root)


def _environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with; the kernel shows it once the new program's
    stack is set up, a moment after ``Popen`` returned (until then it reads empty)."""
    deadline = time.monotonic() + 10
    while not (raw := Path(f"/proc/{pid}/environ").read_bytes()):
        assert time.monotonic() < deadline, f"process {pid} shows no environment"
        time.sleep(0.001)
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def test_the_fork_server_has_a_workers_environment_its_output_unbuffered(fork_server):
    _, pid = fork_server
    environ = _environ(pid)
    assert environ["PYTHONUNBUFFERED"] == "1"  # a job's prints reach its log as printed
    assert environ["NITRO_SERVER_ONLY"] == "kept"
