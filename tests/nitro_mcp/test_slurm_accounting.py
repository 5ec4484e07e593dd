"""The Slurm executor on a cluster that keeps accounting (``slurm_local.up(...,
accounting=True)``: slurmdbd on a MariaDB of its own; the session's cluster of conftest.py),
so the scheduler's states come from ``sacct``, and the status says so: a job followed from
pending (its partition held down) through running to its end, and a worker killed on its node
reported ``lost`` in sacct's words with its last record and the call that resumes it. The
fallback through squeue/scontrol, on the same cluster as clients without accounting see it,
is tested in test_slurm_executor.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import anyio
import pytest

from nitro_core import read_manifest
from nitro_core.jobs import slurm_local
from nitro_core.jobs.files import job_dir
from tests.nitro_mcp.conftest import call, exported
from tests.nitro_mcp.test_slurm_executor import _server, _until, follow_through_the_queue

# a real cluster with MariaDB and slurmdbd; on the one xdist worker of the Slurm tests
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    """The session's two-node cluster with accounting (conftest.py: every daemon it started
    is gone at the session's end), exported as ``SLURM_CONF`` for the module."""
    with exported(slurm_cluster):
        yield slurm_cluster


def test_the_accounting_cluster_runs_slurmdbd_and_mariadb_of_its_own(cluster):
    names = [d["name"] for d in slurm_local.status(cluster.directory)["daemons"]]
    assert names == ["munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "slurmd"]
    listed = subprocess.run(["sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster"],
                            env=cluster.environment(), capture_output=True, text=True,
                            check=True)  # fmt: skip
    assert listed.stdout.split() == ["nitro"]


def test_a_job_is_followed_pending_running_completed_through_sacct(cluster, tmp_path):
    end, seen, engine_seen = follow_through_the_queue(cluster, tmp_path, "sacct")
    assert seen == ["queued", "running", "succeeded"], seen
    assert ("queued", "PENDING", "sacct") in engine_seen, engine_seen
    assert ("running", "RUNNING", "sacct") in engine_seen, engine_seen
    assert end["result"]["stop_reason"] == "completed", end
    assert end["cluster"]["engine"]["source"] == "sacct", end["cluster"]
    assert end["cluster"]["engine"]["nodes"] in ("n1", "n2")


def test_a_worker_killed_on_its_node_is_lost_in_sacct_words(cluster, tmp_path):
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
    assert end["error"] == (
        f"Slurm job {end['cluster']['slurm_id']} ended (FAILED, from sacct) without the worker "
        "recording a result: the allocation is gone (cancelled from outside, a node failed, or "
        f"its time ran out); its last committed record is {last!r}."
    )
    assert end["cluster"]["engine"]["source"] == "sacct"
    assert end["next"].startswith("The run stays resumable: nitro_train(") and (
        "resume='auto'" in end["next"]
    ), end["next"]
