"""The warm worker: a server's evaluations (validate, average) run one after another, each
in a process forked for it from one fork server that imported torch once, each with its
experiment modules imported afresh, its own log and its own end; a job's process killed
mid-job leaves that job ``lost`` and the next evaluation gets a process of its own; the
server's end lets the fork server go."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import anyio
import pytest
from mcp import Client

from nitro_mcp.server import build_server
from tests.nitro_mcp.conftest import call, ended, wait_done

MODULE = '''
from nitro_core.examples import Regression


class Scored(Regression):
    """Regression with a metric the test edits between two validations."""

    def metrics(self, model, batch):
        return {{"mark": (float({mark}) * len(batch["y"]), len(batch["y"]))}}

    def eval_loss(self):
        return True
'''
FAST = {"max_epochs": 1, "samples": 64}


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, ended but not reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _status(root, job_id: str) -> dict:
    return json.loads((root / ".nitro" / "jobs" / job_id / "status.json").read_text())


@pytest.mark.slow  # a train job and a warm worker's two jobs: the slow suite (the default stays under 4 minutes)
def test_two_validations_run_in_one_warm_worker_which_picks_up_an_edited_module(tmp_path):
    module = tmp_path / "scored.py"
    module.write_text(MODULE.format(mark=1))

    async def main():
        server = build_server(tmp_path, experiment_modules=("scored.py",))
        async with Client(server) as client:
            err, job = await call(client, "nitro_train", experiment="Scored", overrides=FAST)
            assert not err, job
            assert (await wait_done(client, job["job_id"]))["state"] == "succeeded"
            args = {"experiment": "Scored", "weights": "latest => latest", "wait_s": 60}
            first = await ended(client, await call(client, "nitro_validate", **args), tmp_path)
            os.utime(module, ns=(0, 0))  # a new stamp even within the clock's resolution
            module.write_text(MODULE.format(mark=2))
            second = await ended(client, await call(client, "nitro_validate", **args), tmp_path)
            return first, second

    (err1, first), (err2, second) = anyio.run(main)
    assert not err1 and not err2, (first, second)
    assert first["metrics"]["mark"] == 1.0 and second["metrics"]["mark"] == 2.0  # the edit
    pids = [_status(tmp_path, r["job_id"])["pid"] for r in (first, second)]
    assert pids[0] != pids[1], pids  # a process forked for each job
    logs = [
        (tmp_path / ".nitro" / "jobs" / r["job_id"] / "log.txt").read_text()
        for r in (first, second)
    ]
    server = re.search(r"run by the warm worker (\d+) \(its job 1\)", logs[0])
    assert server is not None, logs[0]
    server_pid = int(server.group(1))  # one fork server: torch imported once
    for i, (reply, other) in enumerate(((first, second), (second, first)), 1):
        text = logs[i - 1]  # each job's own output in its own log
        assert (
            f"job {reply['job_id']}: run by the warm worker {server_pid} (its job {i}) "
            f"in process {pids[i - 1]}"
        ) in text
        assert other["job_id"] not in text
    deadline = time.monotonic() + 600  # a hang guard: the loop ends on the process's end
    while _running(server_pid):  # the server ended: the fork server goes with it
        assert time.monotonic() < deadline, f"fork server {server_pid} outlived its server"
        time.sleep(0.1)
    reaped = (tmp_path / ".nitro" / "warm.log").read_text()  # its lines, once it ended
    for reply, pid in zip((first, second), pids, strict=True):
        assert f"job {reply['job_id']}: its process {pid} ended (exit code 0)" in reaped


@pytest.mark.slow  # a validation held mid-way, killed, and another: `pytest -m slow`
def test_a_warm_worker_killed_mid_job_leaves_it_lost_and_the_next_validation_works(tmp_path):
    (tmp_path / "slowval.py").write_text(
        "import time\nfrom nitro_core.examples import Regression\n\n\n"
        "class SlowVal(Regression):\n"
        "    def metrics(self, model, batch):\n"
        "        time.sleep(0.5)\n"
        "        return {}\n\n"
        "    def eval_loss(self):\n"
        "        return True\n"
    )

    async def main():
        server = build_server(tmp_path, experiment_modules=("slowval.py",))
        async with Client(server) as client:
            err, job = await call(client, "nitro_train", experiment="SlowVal",
                                  overrides={"max_epochs": 1, "samples": 16, "batch_size": 16})  # fmt: skip
            assert not err, job
            assert (await wait_done(client, job["job_id"]))["state"] == "succeeded"
            slow = {"experiment": "SlowVal", "weights": "latest => latest", "wait_s": 0,
                    "overrides": {"samples": 4000, "batch_size": 16}}  # fmt: skip
            err, held = await call(client, "nitro_validate", **slow)
            assert not err, held
            with anyio.fail_after(600):
                while _status(tmp_path, held["job_id"]).get("phase") != "validating":
                    await anyio.sleep(0.1)
            pid = _status(tmp_path, held["job_id"])["pid"]
            os.kill(pid, signal.SIGKILL)
            lost = await wait_done(client, held["job_id"])
            quick = {"experiment": "SlowVal", "weights": "latest => latest", "wait_s": 60,
                     "overrides": {"samples": 16, "batch_size": 16}}  # fmt: skip
            err, after = await ended(
                client, await call(client, "nitro_validate", **quick), tmp_path
            )
            return pid, lost, err, after

    pid, lost, err, after = anyio.run(main)
    assert lost["state"] == "lost", lost
    assert not err and after["state"] == "succeeded" and "loss" in after["metrics"], after
    assert _status(tmp_path, after["job_id"])["pid"] != pid  # a new process for the job
