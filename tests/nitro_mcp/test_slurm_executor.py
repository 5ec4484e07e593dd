"""``nitro_train(..., executor="slurm")`` on a real Slurm cluster of two nodes on 127.0.0.1
(:mod:`nitro_core.jobs.slurm_local`, the session's cluster of conftest.py, started once and
shared with test_slurm_accounting.py): followed from queued to its end, stopped gracefully and
by force, lost when cancelled from outside, resumed bit for bit, budgeted (steps and time),
across two nodes, and refused when the cluster cannot take it. Its clients here see a cluster
that keeps no accounting (their slurm.conf says ``accounting_storage/none``, so sacct fails as
it does without slurmdbd), so every state here comes through the squeue/scontrol fallback,
which the status names; the same job followed through sacct is in test_slurm_accounting.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import anyio
import pytest
import torch
from mcp import Client, StdioServerParameters

from nitro_core import Nitro, read_manifest
from nitro_core.jobs.files import job_dir
from nitro_core.store import recordio as store
from nitro_mcp.server import build_server
from tests.nitro_mcp.conftest import call, exported, wait_done, without_accounting
from tests.nitro_mcp.slow_experiment import SlowSteps

# a real cluster: daemons, sbatch, srun; one xdist worker runs every Slurm test (one cluster)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]
SLOW = ("tests.nitro_mcp.slow_experiment",)
FAST = {"max_epochs": 3, "samples": 64}


@pytest.fixture(scope="module")
def cluster(slurm_cluster, tmp_path_factory):
    """The session's two-node cluster as its clients see a cluster without accounting
    (conftest.without_accounting), exported as ``SLURM_CONF`` for the module."""
    with exported(without_accounting(slurm_cluster, tmp_path_factory.mktemp("slurm"))) as view:
        yield view


def _server(root, **kw):
    return Client(build_server(root, executor="slurm", experiment_modules=SLOW, **kw))


async def _until(client, job_id, check, limit=600):
    """nitro_status until ``check(status)``; every state seen, in order."""
    seen = []
    with anyio.fail_after(limit):
        while True:
            err, status = await call(client, "nitro_status", job_id=job_id, wait_s=1)
            assert not err, status
            if not seen or seen[-1] != status["state"]:
                seen.append(status["state"])
            if check(status):
                return status, seen
            await anyio.sleep(0.2)


def _tensors(run_dir, entry):
    tensors, _ = store.read_record(run_dir / entry.file)
    return tensors


def follow_through_the_queue(cluster, tmp_path, source):
    """A job submitted while its partition is held down (Slurm takes it, starts none),
    followed until Slurm said PENDING and then RUNNING, each through ``source``, and on to
    its end: its last status, the job states seen in order, and each (job state, Slurm
    state, source) seen in order."""
    seen: list[str] = []
    engine_seen: list[tuple[str, str, str]] = []

    def saw(status):
        """Note the status; returns its (job state, Slurm state, source), if Slurm spoke."""
        if seen[-1:] != [status["state"]]:
            seen.append(status["state"])
        engine = (status.get("cluster") or {}).get("engine")
        now = (status["state"], engine["state"], engine["source"]) if engine else None
        if now is not None and engine_seen[-1:] != [now]:
            engine_seen.append(now)
        return now

    def ended(status):
        saw(status)
        return status["state"] not in ("queued", "running")

    def partition(state):
        subprocess.run(["scontrol", "update", f"PartitionName={cluster.partition}",
                        f"State={state}"], env=cluster.environment(), check=True)  # fmt: skip

    async def main():
        async with _server(tmp_path) as client:
            partition("DOWN")
            try:
                err, job = await call(client, "nitro_train", experiment="SlowSteps",
                                      overrides={"max_epochs": 3, "step_s": 0.05})  # fmt: skip
                assert not err, job
                saw(job)
                queued = ("queued", "PENDING", source)
                await _until(client, job["job_id"], lambda s: saw(s) == queued)
            finally:
                partition("UP")
            running = ("running", "RUNNING", source)
            await _until(client, job["job_id"], lambda s: saw(s) == running)
            end, _ = await _until(client, job["job_id"], ended)
            return end

    return anyio.run(main), seen, engine_seen


def test_a_slurm_job_goes_queued_running_succeeded_through_the_fallback(cluster, tmp_path):
    end, seen, engine_seen = follow_through_the_queue(cluster, tmp_path, "squeue")
    assert seen == ["queued", "running", "succeeded"], seen
    assert ("queued", "PENDING", "squeue") in engine_seen, engine_seen
    assert ("running", "RUNNING", "squeue") in engine_seen, engine_seen
    assert {source for *_, source in engine_seen} <= {"squeue", "scontrol"}  # no slurmdbd here
    assert end["cluster"]["executor"] == "slurm" and end["cluster"]["slurm_id"].isdigit()
    events = [json.loads(line)["event"] for line in
              (job_dir(tmp_path, end["job_id"]) / "events.jsonl").read_text().splitlines()]  # fmt: skip
    assert events[:3] == ["queued", "submitted", "started"] and events[-1] == "succeeded"
    assert end["result"]["stop_reason"] == "completed"


def test_graceful_stop_writes_its_record_and_resume_auto_ends_bitwise_equal(cluster, tmp_path):
    overrides = {"max_epochs": 4, "step_s": 0.05}

    async def main():
        async with _server(tmp_path) as client:
            err, job = await call(client, "nitro_train", experiment="SlowSteps",
                                  overrides=overrides)  # fmt: skip
            assert not err, job
            await _until(
                client, job["job_id"], lambda s: s["state"] == "running" and s["epoch"] >= 1
            )
            err, _ = await call(client, "nitro_stop", job_id=job["job_id"])
            assert not err
            stopped = await wait_done(client, job["job_id"], limit=600)
            err, again = await call(client, "nitro_train", experiment="SlowSteps",
                                    overrides=overrides, resume="auto")  # fmt: skip
            assert not err, again
            return stopped, await wait_done(client, again["job_id"], limit=600)

    stopped, resumed = anyio.run(main)
    assert stopped["state"] == "stopped" and stopped["result"]["stop_reason"] == "requested"
    assert resumed["state"] == "succeeded", resumed
    assert resumed["result"]["run_id"] == stopped["result"]["run_id"]
    _assert_equal_to_a_local_run(tmp_path, max_epochs=4)


def _assert_equal_to_a_local_run(tmp_path, max_epochs):
    """The run in runs/SlowSteps ended where an uninterrupted local run ends, bit for bit."""
    local = Nitro(SlowSteps(max_epochs=max_epochs, step_s=0.0), run_dir=tmp_path / "local")
    local.train()
    run_dir = tmp_path / "runs" / "SlowSteps"
    last = read_manifest(run_dir)[-1]
    assert last.epoch == max_epochs
    mine = _tensors(run_dir, last)
    theirs = _tensors(tmp_path / "local", read_manifest(tmp_path / "local")[-1])
    model = [k for k in mine if k.startswith("params/")]
    assert model and all(torch.equal(mine[k], theirs[k]) for k in model)
    assert local.step == last.step


def test_force_stop_kills_the_job_through_scancel(cluster, tmp_path):
    async def main():
        async with _server(tmp_path) as client:
            err, job = await call(client, "nitro_train", experiment="SlowSteps",
                                  overrides={"max_epochs": 50, "step_s": 0.1})  # fmt: skip
            assert not err, job
            running, _ = await _until(client, job["job_id"], lambda s: s["phase"] == "training")
            err, reply = await call(client, "nitro_stop", job_id=job["job_id"], force=True)
            assert not err, reply
            return running, await wait_done(client, job["job_id"], limit=600)

    running, end = anyio.run(main)
    assert end["state"] == "stopped" and end["phase"] == "killed", end
    slurm_id = end["cluster"]["slurm_id"]
    env = cluster.environment()

    def gone():
        out = subprocess.run(["squeue", "-h", "-j", slurm_id, "-o", "%T"], env=env,
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
        return out in ("", "COMPLETED", "CANCELLED", "FAILED")

    async def wait_gone():
        with anyio.fail_after(600):
            while not gone():
                await anyio.sleep(0.2)

    anyio.run(wait_gone)


def test_scancel_from_outside_stops_the_run_at_its_next_point_with_its_record(cluster, tmp_path):
    async def main():
        async with _server(tmp_path) as client:
            err, job = await call(client, "nitro_train", experiment="SlowSteps",
                                  overrides={"max_epochs": 50, "step_s": 0.05})  # fmt: skip
            assert not err, job
            running, _ = await _until(client, job["job_id"], lambda s: s["epoch"] >= 1)
            subprocess.run(["scancel", running["cluster"]["slurm_id"]],
                           env=cluster.environment(), check=True)  # fmt: skip
            return await wait_done(client, job["job_id"], limit=600)

    end = anyio.run(main)
    assert end["state"] == "stopped", end  # Slurm's SIGTERM: a graceful stop at the next point
    last = read_manifest(tmp_path / "runs" / "SlowSteps")[-1]
    assert last.stop_reason == "requested" and last.epoch == end["epoch"]


def test_a_worker_killed_on_its_node_is_reported_lost_with_the_last_record(cluster, tmp_path):
    async def main():
        async with _server(tmp_path) as client:
            err, job = await call(client, "nitro_train", experiment="SlowSteps",
                                  overrides={"max_epochs": 50, "step_s": 0.05})  # fmt: skip
            assert not err, job
            await _until(client, job["job_id"], lambda s: s["epoch"] >= 1)
            pid = json.loads((job_dir(tmp_path, job["job_id"]) / "status.json").read_text())["pid"]
            os.kill(pid, signal.SIGKILL)  # the node's worker dies: the allocation ends with it
            end, _ = await _until(client, job["job_id"], lambda s: s["state"] == "lost")
            return end

    end = anyio.run(main)
    last = read_manifest(tmp_path / "runs" / "SlowSteps")[-1].file
    assert f"its last committed record is {last!r}" in end["error"], end["error"]
    assert end["error"].startswith(f"Slurm job {end['cluster']['slurm_id']} ended (")


def test_a_step_budget_on_slurm_stops_with_budget_and_resumes(cluster, tmp_path):
    async def main():
        async with _server(tmp_path) as client:
            err, job = await call(client, "nitro_train", experiment="Regression",
                                  overrides={"max_epochs": 3, "samples": 256}, max_steps=5,
                                  time_limit=600)  # fmt: skip
            assert not err, job
            return await wait_done(client, job["job_id"], limit=600)

    end = anyio.run(main)
    assert end["state"] == "stopped" and end["result"]["stop_reason"] == "budget", end
    argv = json.loads((job_dir(tmp_path, end["job_id"]) / "sbatch.json").read_text())
    assert "--time=13" in argv  # ceil((600 * 1.1 + 120) / 60) minutes: a fallback
    assert read_manifest(tmp_path / "runs" / "Regression")[-1].stop_reason == "budget"


def test_a_time_limit_on_slurm_stops_with_budget_and_resume_auto_ends_bitwise_equal(
    cluster, tmp_path
):
    overrides = {"max_epochs": 3, "step_s": 0.05}  # 24 steps an epoch: 1.2 s of sleep

    async def main():
        async with _server(tmp_path) as client:
            err, job = await call(client, "nitro_train", experiment="SlowSteps",
                                  overrides=overrides, time_limit=1)  # fmt: skip
            assert not err, job
            stopped = await wait_done(client, job["job_id"], limit=600)
            err, again = await call(client, "nitro_train", experiment="SlowSteps",
                                    overrides=overrides, resume="auto")  # fmt: skip
            assert not err, again
            return stopped, await wait_done(client, again["job_id"], limit=600)

    stopped, resumed = anyio.run(main)
    assert stopped["state"] == "stopped" and stopped["result"]["stop_reason"] == "budget", stopped
    argv = json.loads((job_dir(tmp_path, stopped["job_id"]) / "sbatch.json").read_text())
    assert "--time=3" in argv  # ceil((1 * 1.1 + 120) / 60) minutes: a fallback
    budget = [e for e in read_manifest(tmp_path / "runs" / "SlowSteps") if e.stop_reason]
    assert [(e.epoch, e.stop_reason) for e in budget][0] == (1, "budget")  # no point fits 1 s
    assert resumed["state"] == "succeeded", resumed
    assert resumed["result"]["run_id"] == stopped["result"]["run_id"]
    _assert_equal_to_a_local_run(tmp_path, max_epochs=3)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_nodes_of_one_process_equal_one_node_of_two(cluster, tmp_path, strategy):
    async def main():
        async with _server(tmp_path) as client:
            out = {}
            for name, nodes, nproc in (("two_nodes", 2, 1), ("one_node", 1, 2)):
                err, job = await call(client, "nitro_train", experiment="Regression",
                                      overrides=FAST, run_dir=f"runs/{name}", nodes=nodes,
                                      nproc=nproc, strategy=strategy)  # fmt: skip
                assert not err, job
                out[name] = await wait_done(client, job["job_id"], limit=600)
                assert out[name]["state"] == "succeeded", out[name]
            return out

    anyio.run(main)
    entries = {name: read_manifest(tmp_path / "runs" / name) for name in ("two_nodes", "one_node")}
    assert [(e.epoch, e.step) for e in entries["two_nodes"]] == [
        (e.epoch, e.step) for e in entries["one_node"]
    ]  # one manifest entry per record in both
    a = _read(tmp_path / "runs" / "two_nodes", entries["two_nodes"][-1])
    b = _read(tmp_path / "runs" / "one_node", entries["one_node"][-1])
    params = [k for k in a if k.startswith("params/")]
    assert params and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in params)


def _read(run_dir, entry):
    return _tensors(run_dir, entry)  # a file, or an FSDP record directory read as one


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ({"slurm": {"partition": "gpu"}}, "slurm partition 'gpu' is not one of this cluster's: "
         "debug. Send slurm={'partition': 'debug'} (sinfo lists them)."),
        ({"nodes": 3}, "nodes=3 is more nodes than partition 'debug' has (2). Send nodes from 1 "
         "to 2, e.g. nodes=2."),
        ({"slurm": {"extra": ["--output=/tmp/x"]}}, "slurm.extra line '--output=/tmp/x' is not "
         "an sbatch option Nitro passes on: the job's directory, output and working directory "
         "are Nitro's. Send only --mem, --mem-per-cpu, --mem-per-gpu, --cpus-per-task, "
         "--gpus-per-node, --gpus-per-task, --constraint, --exclusive, --reservation, --comment, "
         "--exclude, --nodelist, --mail-type, --mail-user, --nice, --licenses, e.g. "
         "slurm={'extra': ['--mem=16G']}."),
        ({"executor": "local", "nodes": 2}, "nodes=2 runs on a cluster: send executor='slurm' "
         "with it (nitro serve --executor slurm makes it the default), or leave it out to train "
         "on this machine."),
    ],
)  # fmt: skip
def test_what_the_cluster_cannot_take_is_refused_at_the_call(cluster, tmp_path, args, text):
    async def main():
        async with _server(tmp_path) as client:
            return await call(client, "nitro_train", experiment="Regression", **args)

    err, reply = anyio.run(main)
    assert err and reply == f"Error executing tool nitro_train: {text}", reply
    assert not (tmp_path / ".nitro" / "jobs").exists() or not any(
        (tmp_path / ".nitro" / "jobs").iterdir()
    )


def test_hostile_slurm_options_create_nothing_on_the_cluster(cluster, tmp_path):
    """The audit's markers: a newline in an option and a second option on one extra line;
    each refused at the call, no job submitted, no marker created on the node."""
    markers = [tmp_path / f"marker{i}" for i in range(3)]
    hostile = [
        {"account": f"acct\ntouch {markers[0]}"},
        {"qos": f"normal\rtouch {markers[1]}"},
        {"extra": [f"--comment=x --output={markers[2]}"]},
    ]

    def queue():
        done = subprocess.run(["squeue", "-h", "-o", "%i"], env=cluster.environment(),
                              capture_output=True, text=True, check=True)  # fmt: skip
        return set(done.stdout.split())

    async def main():
        async with _server(tmp_path) as client:
            return [await call(client, "nitro_train", experiment="Regression", slurm=options)
                    for options in hostile]  # fmt: skip

    before = queue()  # earlier tests' jobs may still be queued or ending
    for err, reply in anyio.run(main):
        assert err and ("it must match" in reply or "matching ^--" in reply), reply
    assert queue() <= before  # nothing was submitted
    assert not any(m.exists() for m in markers)
    assert not (tmp_path / ".nitro" / "jobs").exists() or not any(
        (tmp_path / ".nitro" / "jobs").iterdir()
    )


def test_a_root_with_spaces_trains_on_the_cluster(cluster, tmp_path):
    """Paths reach sbatch and the worker as argv, so a root holding spaces just works."""
    root = tmp_path / "my runs" / "a b"
    root.mkdir(parents=True)

    async def main():
        async with _server(root) as client:
            err, job = await call(client, "nitro_train", experiment="Regression",
                                  overrides={"max_epochs": 1, "samples": 64},
                                  slurm={"extra": ["--comment=spaces"]})  # fmt: skip
            assert not err, job
            return await wait_done(client, job["job_id"], limit=600)

    end = anyio.run(main)
    assert end["state"] == "succeeded", end
    assert read_manifest(root / "runs" / "Regression")
    argv = json.loads((job_dir(root, end["job_id"]) / "sbatch.json").read_text())
    assert f"--chdir={root}" in argv and "--comment=spaces" in argv


def test_no_sbatch_on_the_path_is_refused_with_what_to_send(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm client here

    async def main():
        async with _server(tmp_path) as client:
            return await call(client, "nitro_train", experiment="Regression")

    err, reply = anyio.run(main)
    assert err and reply == (
        "Error executing tool nitro_train: executor='slurm' needs Slurm's sbatch on the "
        "server's PATH, and there is none. Send executor='local', or start the server where "
        "sbatch runs (a login node); to try on one machine: python -m "
        "nitro_core.jobs.slurm_local up."
    ), reply


def test_nitro_serve_executor_slurm_sets_the_default_executor_and_partition(cluster, tmp_path):
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nitro_mcp.cli", "serve", "--root", str(tmp_path), "--executor", "slurm",
              "--slurm-partition", "gpu"],
        env=cluster.environment(),
    )  # fmt: skip

    async def main():
        async with Client(params) as client:  # a real stdio subprocess, as an agent starts it
            return await call(client, "nitro_train", experiment="Regression")

    err, reply = anyio.run(main)
    assert err and reply == (
        "Error executing tool nitro_train: slurm partition 'gpu' is not one of this cluster's: "
        "debug. Send slurm={'partition': 'debug'} (sinfo lists them)."
    ), reply
    assert not (tmp_path / ".nitro" / "jobs").exists() or not any(
        (tmp_path / ".nitro" / "jobs").iterdir()
    )


def test_nitro_train_executor_slurm_submits_the_set_overrides_and_trains_them(cluster, tmp_path):
    """``nitro train ... --executor slurm --set F=V`` submits the call the tool would: the
    job's spec holds the overrides and the run trains them (it once submitted ``{}``, trained
    the class defaults and reported ``succeeded``)."""
    done = subprocess.run(
        [sys.executable, "-m", "nitro_mcp.cli", "train", "Regression", "--executor", "slurm",
         "--set", "max_epochs=1", "--set", "samples=64"],
        cwd=tmp_path, env={**os.environ, **cluster.environment()}, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    end = json.loads(done.stdout.splitlines()[-1])
    assert end["state"] == "succeeded", end
    spec = json.loads((job_dir(tmp_path, end["job_id"]) / "spec.json").read_text())
    assert spec["call"]["overrides"] == {"max_epochs": 1, "samples": 64}, spec
    entries = read_manifest(tmp_path / "runs" / "Regression")
    assert [e.epoch for e in entries][-1] == 1  # not the class default's epochs
