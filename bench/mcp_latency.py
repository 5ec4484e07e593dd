"""MCP round trips over a real stdio connection.

Measures, against `nitro serve` subprocesses:
- `nitro_status` round trip (wait_s=0) on a finished job: median and 95th percentile;
- `nitro_train` reply time (the call returns once the job is created and its worker
  spawned, before the worker imports torch): median and max; target median < 0.5 s;
- baseline: `nitro_experiments`' round trip with its cached answer, the cheapest tool
  (the transport's own cost), reported beside them as a ratio;
- following: the tokens (characters / 4 of each request and reply text) an agent spends
  to follow a 100-epoch run to its end with the advised call
  (`nitro_status(wait_s=25, until='end', brief=true)`; target < 5,000), beside the same
  run followed the earlier way (`nitro_status(wait_s=20)`, full replies at each epoch);
- `nitro_validate` reply time while two trainings run, beside the same call on an idle
  server (evaluations have slots of their own, so it never queues behind training);
- `nitro_jobs(limit=20)` with 1,000 job directories (the job index: no rescan of every
  job per call), beside the same call over 10 jobs and a full rescan of the 1,000.

Run: python bench/mcp_latency.py [--calls 200] [--trains 5] [--follow-epochs 100] [--jobs 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from nitro_core.jobs import JobManager
from nitro_core.jobs.call_models import TrainCall
from nitro_core.jobs.files import JobSpec, JobStatus

END = ("succeeded", "failed", "stopped", "lost")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def server(root: str, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "nitro_mcp.cli", "serve", "--root", root, *extra],
        env=dict(os.environ),
    )


async def tool(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    assert not result.is_error, result.content[0].text
    return result.structured_content or {}


async def measure(root: str, calls: int, trains: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"train": [], "status": [], "experiments": []}
    async with Client(server(root, "--max-jobs", "8")) as client:
        await client.call_tool("nitro_experiments", {})  # warm the splits cache
        jobs = []
        for i in range(trains):
            args = {
                "experiment": "Regression",
                "run_dir": f"runs/r{i}",
                "overrides": {"max_epochs": 1, "samples": 128},
            }
            t = time.perf_counter()
            result = await client.call_tool("nitro_train", args)
            out["train"].append(time.perf_counter() - t)
            assert not result.is_error, result.content[0].text
            jobs.append(result.structured_content["job_id"])
        for job in jobs:  # let them finish so status calls read a settled job
            while (await tool(client, "nitro_status", {"job_id": job, "wait_s": 10}))[
                "state"
            ] not in END:
                pass
        for i in range(calls):
            t = time.perf_counter()
            await client.call_tool("nitro_status", {"job_id": jobs[i % len(jobs)]})
            out["status"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await client.call_tool("nitro_experiments", {})
            out["experiments"].append(time.perf_counter() - t)
    return out


# -- following a run -------------------------------------------------------------------------
async def follow(client: Client, run_dir: str, epochs: int, advised: bool) -> dict[str, float]:
    """Train ``epochs`` epochs and follow the job to its end as an agent would: the advised
    cheap call, or the earlier one (full replies, back at every epoch end)."""
    train = {
        "experiment": "Regression",
        "run_dir": run_dir,
        "overrides": {"max_epochs": epochs, "samples": 4096},
    }
    chars = len(json.dumps(train))
    result = await client.call_tool("nitro_train", train)
    assert not result.is_error, result.content[0].text
    chars += len(result.content[0].text)
    job = result.structured_content
    if advised:
        args = {"job_id": job["job_id"], "wait_s": 25, "until": "end", "brief": True}
    else:
        args = {"job_id": job["job_id"], "wait_s": 20}
    polls = notes = 0
    started = time.perf_counter()

    async def on_progress(*_: Any) -> None:
        nonlocal notes
        notes += 1

    while True:
        result = await client.call_tool("nitro_status", args, progress_callback=on_progress)
        assert not result.is_error, result.content[0].text
        polls += 1
        chars += len(json.dumps(args)) + len(result.content[0].text)
        if result.structured_content["state"] in END:
            break
    state = result.structured_content["state"]
    assert state == "succeeded", result.content[0].text
    return {
        "tokens": chars / 4, "polls": polls, "notifications": notes,
        "seconds": time.perf_counter() - started,
    }  # fmt: skip


async def measure_follow(root: str, epochs: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    async with Client(server(root, "--max-jobs", "2")) as client:

        async def run(name: str, advised: bool) -> None:
            out[name] = await follow(client, f"runs/follow_{name}", epochs, advised)

        async with anyio.create_task_group() as tg:  # both at once: the same conditions
            tg.start_soon(run, "advised", True)
            tg.start_soon(run, "earlier", False)
    return out


# -- validation while training -------------------------------------------------------------
async def measure_validate(root: str, repeats: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"idle": [], "busy": []}
    small = {"max_epochs": 1, "samples": 256}
    validate = {
        "experiment": "Regression",
        "run_dir": "runs/small",
        "overrides": small,
        "wait_s": 60,
    }
    async with Client(server(root, "--max-jobs", "2", "--max-eval-jobs", "2")) as client:
        job = await tool(
            client,
            "nitro_train",
            {"experiment": "Regression", "run_dir": "runs/small", "overrides": small},
        )
        while (
            await tool(
                client, "nitro_status", {"job_id": job["job_id"], "wait_s": 25, "until": "end"}
            )
        )["state"] not in END:
            pass

        async def timed(kind: str) -> None:
            for _ in range(repeats):
                t = time.perf_counter()
                reply = await tool(client, "nitro_validate", validate)
                assert reply["state"] == "succeeded", reply
                out[kind].append(time.perf_counter() - t)

        await timed("idle")
        long = {"max_epochs": 10_000, "samples": 20_000}  # CPU-bound: the machine is busy
        trainings = [
            (
                await tool(
                    client,
                    "nitro_train",
                    {"experiment": "Regression", "run_dir": f"runs/busy{i}", "overrides": long},
                )
            )["job_id"]
            for i in range(2)
        ]
        try:
            for job_id in trainings:  # both past setup, training
                while (await tool(client, "nitro_status", {"job_id": job_id, "wait_s": 5}))[
                    "epoch"
                ] < 1:
                    pass
            await timed("busy")
        finally:
            for job_id in trainings:
                await tool(client, "nitro_stop", {"job_id": job_id, "force": True})
    return out


# -- listing many jobs --------------------------------------------------------------------------
def fake_jobs(root: Path, n: int) -> None:
    """``n`` finished job directories, as workers leave them."""
    for i in range(n):
        job_id = f"20200101-{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-{i:06x}"
        directory = root / ".nitro" / "jobs" / job_id
        directory.mkdir(parents=True)
        created = f"2020-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000Z"
        run_dir = str(root / "runs" / f"r{i}")
        call = TrainCall(experiment="Regression", run_dir=run_dir)
        spec = JobSpec(job_id=job_id, kind="train", call=call, created=created)
        status = JobStatus(job_id=job_id, kind="train", state="succeeded", phase="done", run_dir=run_dir,
                           epoch=5, created=created, ended=created, result={"run_id": f"{i:08x}"})  # fmt: skip
        (directory / "spec.json").write_text(spec.model_dump_json(indent=1))
        (directory / "status.json").write_text(status.model_dump_json(indent=1))
        (directory / "events.jsonl").write_text('{"event": "queued"}\n{"event": "succeeded"}\n')


async def time_jobs(root: str, n: int, calls: int) -> dict[str, Any]:
    out: dict[str, Any] = {"calls": []}
    async with Client(server(root)) as client:
        t = time.perf_counter()
        first = await tool(client, "nitro_jobs", {"limit": 20})
        out["first"] = time.perf_counter() - t  # builds the index when it is missing
        assert len(first["jobs"]) == min(20, n)
        for i in range(calls):
            t = time.perf_counter()
            await tool(
                client, "nitro_jobs", {"limit": 20, "cursor": str(20 * (i % 5)) if i % 5 else None}
            )
            out["calls"].append(time.perf_counter() - t)
    return out


def measure_jobs(many: int, calls: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in (10, many):
        with tempfile.TemporaryDirectory() as root:
            fake_jobs(Path(root), n)
            out[n] = anyio.run(time_jobs, root, n, calls)
            t = time.perf_counter()
            listed = JobManager(Path(root)).list()  # the full rescan: every job's status read
            out[n]["rescan"] = time.perf_counter() - t
            assert len(listed) == n
    return out


# -- the report -----------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--trains", type=int, default=5)
    parser.add_argument("--follow-epochs", type=int, default=100)
    parser.add_argument("--validate-repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} cores, load average {load} at the start\n")
    with tempfile.TemporaryDirectory() as root:
        out = anyio.run(measure, root, args.calls, args.trains)
    ms = {k: [v * 1000 for v in vs] for k, vs in out.items()}
    print(f"{'call':<22}{'n':>5}{'median ms':>11}{'p95 ms':>9}{'max ms':>9}")
    for name in ("status", "experiments", "train"):
        v = ms[name]
        print(
            f"{name:<22}{len(v):>5}{statistics.median(v):>11.2f}{pct(v, 0.95):>9.2f}{max(v):>9.2f}"
        )
    ratio = statistics.median(ms["status"]) / statistics.median(ms["experiments"])
    print(f"nitro_status / nitro_experiments median ratio = {ratio:.2f}")
    train = statistics.median(ms["train"])
    verdict = "PASS" if train < 500 else "FAIL"
    print(f"RESULT nitro_train reply median {train:.1f} ms (target < 500 ms) {verdict}; "
          f"nitro_status median {statistics.median(ms['status']):.1f} ms, p95 {pct(ms['status'], 0.95):.1f} ms")  # fmt: skip

    with tempfile.TemporaryDirectory() as root:
        fol = anyio.run(measure_follow, root, args.follow_epochs)
    print(f"\nfollowing a {args.follow_epochs}-epoch run to its end (two runs at once)")
    print(f"{'way':<44}{'tokens':>8}{'polls':>7}{'notes':>7}{'s':>7}")
    for name, label in (
        ("advised", "wait_s=25, until='end', brief=true"),
        ("earlier", "wait_s=20 (full replies, each epoch)"),
    ):
        f = fol[name]
        print(f"{label:<44}{f['tokens']:>8.0f}{f['polls']:>7.0f}{f['notifications']:>7.0f}{f['seconds']:>7.1f}")  # fmt: skip
    tokens = fol["advised"]["tokens"]
    print(f"RESULT following tokens {tokens:.0f} (target < 5000) {'PASS' if tokens < 5000 else 'FAIL'}; "
          f"the earlier way {fol['earlier']['tokens']:.0f} ({fol['earlier']['tokens'] / tokens:.0f}x)")  # fmt: skip

    with tempfile.TemporaryDirectory() as root:
        val = anyio.run(measure_validate, root, args.validate_repeats)
    idle, busy = statistics.median(val["idle"]), statistics.median(val["busy"])
    print(f"\nnitro_validate reply, median of {args.validate_repeats}: idle {idle:.2f} s, "
          f"two trainings running {busy:.2f} s (max {max(val['busy']):.2f} s; {busy / idle:.1f}x idle)")  # fmt: skip
    print(f"RESULT nitro_validate while two trainings run {busy:.2f} s (within wait_s) "
          f"{'PASS' if max(val['busy']) < 20 else 'FAIL'}")  # fmt: skip

    jobs = measure_jobs(args.jobs, 50)
    print(f"\nnitro_jobs(limit=20), {50} calls after the first")
    print(
        f"{'job directories':<18}{'first ms':>10}{'median ms':>11}{'p95 ms':>9}{'full rescan ms':>16}"
    )
    for n, r in jobs.items():
        calls = [c * 1000 for c in r["calls"]]
        print(f"{n:<18}{r['first'] * 1000:>10.1f}{statistics.median(calls):>11.2f}{pct(calls, 0.95):>9.2f}{r['rescan'] * 1000:>16.1f}")  # fmt: skip
    many = statistics.median(jobs[args.jobs]["calls"]) * 1000
    few = statistics.median(jobs[10]["calls"]) * 1000
    print(f"RESULT nitro_jobs(limit=20) with {args.jobs} jobs: median {many:.1f} ms "
          f"({many / few:.1f}x the 10-job median {few:.1f} ms; a full rescan takes {jobs[args.jobs]['rescan'] * 1000:.0f} ms)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
