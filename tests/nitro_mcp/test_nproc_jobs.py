"""``nitro_train(..., nproc=N)``: a job on several processes through torch.distributed.run,
followed, stopped and killed through the server like any other."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core import read_manifest
from nitro_core.store import recordio as store
from nitro_mcp.server import build_server
from tests.nitro_mcp.conftest import call, wait_done


def test_nproc_and_strategy_are_refused_with_what_to_send(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            err, text = await call(client, "nitro_train", experiment="Regression", nproc=0)
            assert (
                err
                and (
                    "nproc=0 is not a process count; send an integer from 1 to 64, e.g. nproc=2 "
                    "(one process per GPU, or several on CPU with the gloo backend)."
                )
                in text
            )
            err, text = await call(
                client, "nitro_train", experiment="Regression", nproc=2, strategy="zero3"
            )
            assert (
                err
                and (
                    "strategy='zero3' is not a strategy; send 'auto' (DDP when nproc > 1), 'ddp' "
                    "or 'fsdp'."
                )
                in text
            )

    anyio.run(main)


@pytest.mark.slow  # real ranks through torch.distributed.run
def test_a_two_process_job_trains_reports_from_rank_0_and_stops_every_rank_together(tmp_path):
    async def main():
        async with Client(
            build_server(tmp_path, experiment_modules=("tests.nitro_mcp.slow_experiment",))
        ) as client:
            err, job = await call(
                client, "nitro_train", experiment="SlowSteps", nproc=2,
                overrides={"max_epochs": 40, "step_s": 0.05},
            )  # fmt: skip
            assert not err, job
            with anyio.fail_after(90):
                while True:
                    err, status = await call(client, "nitro_status", job_id=job["job_id"], wait_s=5)
                    assert status["state"] == "running", status
                    if status["epoch"] >= 1:
                        break
            err, stopped = await call(client, "nitro_stop", job_id=job["job_id"])
            assert not err, stopped
            final = await wait_done(client, job["job_id"])
            assert final["state"] == "stopped", final
            assert final["result"]["stop_reason"] == "requested"
            run_dir = tmp_path / "runs/SlowSteps"
            entries = read_manifest(run_dir)
            assert entries[-1].stop_reason == "requested"
            meta = store.read_header(run_dir / entries[-1].file)
            assert meta["distributed"] == {"world": 2, "strategy": "ddp"}
            # one event per point (rank 0 reports), none per rank
            events = [
                json.loads(line)
                for line in (tmp_path / ".nitro/jobs" / job["job_id"] / "events.jsonl").open()
            ]
            epochs = [e["epoch"] for e in events if e["event"] == "epoch"]
            assert epochs == sorted(set(epochs)) and epochs[-1] == entries[-1].epoch

            # a forced stop kills every rank: the launcher and the ranks are the worker's group
            err, job2 = await call(
                client, "nitro_train", experiment="SlowSteps", nproc=2, resume="auto",
                overrides={"max_epochs": 40, "step_s": 0.05},
            )  # fmt: skip
            with anyio.fail_after(90):
                while True:
                    err, status = await call(
                        client, "nitro_status", job_id=job2["job_id"], wait_s=5
                    )
                    assert status["state"] == "running", status
                    if status["phase"] == "training":
                        break
            err, killed = await call(client, "nitro_stop", job_id=job2["job_id"], force=True)
            assert not err and killed["phase"] == "killed", killed
            job2_dir = str(tmp_path / ".nitro/jobs" / job2["job_id"])
            with anyio.fail_after(10):  # no rank outlives the kill
                while _processes_naming(job2_dir):
                    await anyio.sleep(0.2)

    anyio.run(main)


def _processes_naming(text: str) -> list[int]:
    """Live processes whose command line names ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                found.append(int(proc.name))
    return found
