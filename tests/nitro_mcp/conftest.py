"""Fixtures for the MCP tests: a server over a temporary root, a finished training run in a
shared root so most tests need not train, and one local Slurm cluster for the session."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core.jobs import slurm_local
from nitro_mcp.server import build_server

FAST = {"max_epochs": 3, "samples": 256}


async def call(client: Client, name: str, **args):
    """Call a tool; returns (is_error, structured result or error text)."""
    result = await client.call_tool(name, args)
    if result.is_error:
        return True, result.content[0].text
    return False, result.structured_content


async def wait_done(client: Client, job_id: str, limit: float = 300) -> dict:
    """The job's full status once it ended, however slow the machine (at most ``limit`` s)."""
    with anyio.fail_after(limit):
        while True:
            err, status = await call(client, "nitro_status", job_id=job_id, wait_s=10)
            assert not err, status
            if status["state"] not in ("queued", "running"):
                return status


async def ended(client: Client, reply: tuple, root=None, limit: float = 300) -> tuple:
    """A ``nitro_validate`` or ``average`` reply (as ``call`` returns it) as it reads once its
    job ended: when the call's ``wait_s`` passed first (a loaded machine), the job is followed
    with nitro_status and the reply's fields are filled from the job's result, paths shown
    relative to ``root`` as the tool shows them."""
    err, body = reply
    if err or body["state"] not in ("queued", "running"):
        return reply
    status = await wait_done(client, body["job_id"], limit)
    result = status.get("result") or {}
    out = {**body, "state": status["state"], "error": status.get("error"), "next": status["next"]}
    for key in ("metrics", "averaged_from", "saved", "checkpoint"):
        if key in body:
            value = result.get(key)
            if key in ("saved", "checkpoint") and value and root is not None:
                value = os.path.relpath(value, root)
            out[key] = value
    out["warnings"] = list(dict.fromkeys([*body["warnings"], *(result.get("warnings") or [])]))
    return False, out


@pytest.fixture(scope="session")
def trained_root(tmp_path_factory):
    """A root holding runs/Classifier, trained by a real worker through the server."""
    root = tmp_path_factory.mktemp("root")

    async def train():
        async with Client(build_server(root)) as client:
            err, job = await call(client, "nitro_train", experiment="Classifier", overrides=FAST)
            assert not err, job
            status = await wait_done(client, job["job_id"])
            assert status["state"] == "succeeded", status
            return status

    status = anyio.run(train)
    return root, status


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """One two-node Slurm cluster on 127.0.0.1 with accounting (slurmdbd on a MariaDB of its
    own) for the whole session, shared by test_slurm_accounting.py and test_slurm_executor.py
    (the latter through :func:`without_accounting`): started once, on first use (about 10 s of
    daemons and a database; Slurm installed first when root and missing, though CI's .ci/run
    installs it before the tests), and every daemon it started gone at the end."""
    started = slurm_local.up(2, tmp_path_factory.mktemp("slurm"), accounting=True)
    pids = [d["pid"] for d in json.loads((started.directory / "daemons.json").read_text())]
    yield started
    assert sorted(slurm_local.down(started.directory)) == sorted(pids)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def without_accounting(cluster: slurm_local.Cluster, where: Path) -> slurm_local.Cluster:
    """The cluster as its clients see it when it keeps no accounting: a copy of its slurm.conf
    in ``where`` whose accounting storage is ``none`` (the same daemons, ports and munge
    socket). ``sacct`` and ``sacctmgr`` read that line from the client's slurm.conf and fail on
    it as on a cluster without slurmdbd ("Slurm accounting storage is disabled"), so every
    state comes through squeue/scontrol; sbatch, squeue, scontrol, scancel and sinfo talk to
    slurmctld as before."""
    where.mkdir(parents=True, exist_ok=True)
    conf = re.sub(r"(?m)^AccountingStorage\w+=.*\n", "", cluster.conf.read_text())
    (where / "slurm.conf").write_text(conf + "AccountingStorageType=accounting_storage/none\n")
    return slurm_local.Cluster(where, cluster.nodes, cluster.partition, accounting=False)


@contextmanager
def exported(cluster: slurm_local.Cluster) -> Iterator[slurm_local.Cluster]:
    """The cluster's ``SLURM_CONF`` in this process's environment (the server's executor and
    the Slurm clients read it) while the block runs; the previous value after."""
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
