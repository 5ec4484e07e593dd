"""The Slurm executor's overhead, against the local executor on the same machine.

Measures, against two `nitro serve` stdio subprocesses (`--executor local`, the baseline,
and `--executor slurm`) and a real Slurm cluster on 127.0.0.1 that this script starts and
stops (`nitro_core.jobs.slurm_local`):
- time from the `nitro_train` call to the first progress (the first status showing training
  under way: an epoch done or progress inside one) and to the end of a tiny run (Regression,
  2 epochs of 64 samples), each polled with `nitro_status(wait_s=0, brief=true)` every
  50 ms; median of --runs runs per executor, interleaved; ratio Slurm / local;
- `nitro_status` (full reply, wait_s=0) round trips on a running job, back to back for
  --seconds (and at least --calls calls): the
  Slurm job's calls that needed no engine query (the scheduler's word younger than a
  second; target median < 50 ms) and those that queried it, beside the same call on a local
  job (no engine at all);
- engine queries: every `sacct`/`squeue`/`scontrol` the Slurm server runs goes through a
  wrapper on its PATH that logs it; a query starts with `sacct -j <id>`, so their count
  over the stretch of status calls, against its length in seconds, checks the rate limit
  (target: at most one a second per job).

Run from the repository root: python bench/slurm_overhead.py [--runs 3] [--seconds 10]
[--calls 300] [--nodes 1] [--accounting]  (root, with Debian's Slurm packages or apt to install them)
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from nitro_core.jobs import slurm_local

END = ("succeeded", "failed", "stopped", "lost")
TINY = {"experiment": "Regression", "overrides": {"max_epochs": 2, "samples": 64}}
LONG = {"experiment": "SlowSteps", "overrides": {"max_epochs": 1000, "step_s": 0.05}}
ENGINE = ("sacct", "squeue", "scontrol")
REPO = Path(__file__).resolve().parent.parent


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def wrappers(directory: Path, log: Path) -> Path:
    """A directory of ``sacct``, ``squeue`` and ``scontrol`` wrappers that log each call."""
    directory.mkdir()
    for name in ENGINE:
        real = shutil.which(name)
        assert real is not None, f"{name} is not on PATH (slurm_local.up installs it)"
        path = directory / name
        path.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexec {real} "$@"\n')
        path.chmod(0o755)
    return directory


def server(root: Path, executor: str, env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "nitro_mcp.cli", "serve", "--root", str(root), "--executor", executor,
              "--experiment-module", "tests.nitro_mcp.slow_experiment"],
        env=env,
    )  # fmt: skip


async def tool(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    assert not result.is_error, result.content[0].text
    return result.structured_content or {}


async def tiny_run(client: Client, run_dir: str) -> tuple[float, float]:
    """Seconds from the nitro_train call to the first progress, and to the job's end."""
    t = time.perf_counter()
    job = await tool(client, "nitro_train", {**TINY, "run_dir": run_dir})
    first = None
    while True:
        status = await tool(
            client, "nitro_status", {"job_id": job["job_id"], "wait_s": 0, "brief": True}
        )
        if first is None and (status["epoch"] >= 1 or status.get("progress") is not None):
            first = time.perf_counter() - t
        if status["state"] in END:
            assert status["state"] == "succeeded", status
            return first if first is not None else time.perf_counter() - t, (
                time.perf_counter() - t
            )
        await anyio.sleep(0.05)


async def status_calls(
    client: Client, seconds: float, calls: int, log: Path | None
) -> dict[str, Any]:
    """Back-to-back full nitro_status calls on a running SlowSteps job for ``seconds`` (and
    at least ``calls`` calls): each call's seconds and whether it queried the engine (the
    wrappers' log grew), then a forced stop."""
    job = await tool(client, "nitro_train", {**LONG, "run_dir": "runs/long"})
    job_id = job["job_id"]
    while (await tool(client, "nitro_status", {"job_id": job_id, "wait_s": 5}))["epoch"] < 1:
        pass  # running, past its setup

    def queries() -> int:
        if log is None or not log.exists():
            return 0
        return sum(1 for line in log.read_text().splitlines() if line.startswith("sacct "))

    out: dict[str, Any] = {"cached": [], "queried": []}
    before = start = queries()
    began = time.perf_counter()
    while time.perf_counter() - began < seconds or len(out["cached"] + out["queried"]) < calls:
        t = time.perf_counter()
        await tool(client, "nitro_status", {"job_id": job_id, "wait_s": 0})
        took = time.perf_counter() - t
        now = queries()
        out["queried" if now > before else "cached"].append(took)
        before = now
    out["seconds"] = time.perf_counter() - began
    out["queries"] = queries() - start
    await tool(client, "nitro_stop", {"job_id": job_id, "force": True})
    while (await tool(client, "nitro_status", {"job_id": job_id, "wait_s": 5}))["state"] not in END:
        pass
    return out


async def measure(
    roots: dict[str, Path],
    envs: dict[str, dict[str, str]],
    runs: int,
    seconds: float,
    calls: int,
    log: Path,
) -> dict[str, Any]:
    out: dict[str, Any] = {e: {"first": [], "end": []} for e in roots}
    async with (
        Client(server(roots["local"], "local", envs["local"])) as local,
        Client(server(roots["slurm"], "slurm", envs["slurm"])) as slurm,
    ):
        clients = {"local": local, "slurm": slurm}
        for i in range(runs):  # interleaved: the same conditions for both
            for name, client in clients.items():
                first, end = await tiny_run(client, f"runs/tiny{i}")
                out[name]["first"].append(first)
                out[name]["end"].append(end)
        for name, client in clients.items():
            out[name]["status"] = await status_calls(
                client, seconds, calls, log if name == "slurm" else None
            )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--accounting", action="store_true",
                        help="slurmdbd on a MariaDB of its own, so sacct answers")  # fmt: skip
    args = parser.parse_args()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} cores, load average {load} at the start")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        t = time.perf_counter()
        cluster = slurm_local.up(args.nodes, base / "cluster", accounting=args.accounting)
        print(f"cluster: {args.nodes} node(s), accounting {'on' if args.accounting else 'off'}, "
              f"up in {time.perf_counter() - t:.1f} s\n")  # fmt: skip
        try:
            log = base / "engine.log"
            bin_dir = wrappers(base / "bin", log)
            pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
            local_env = {**os.environ, "PYTHONPATH": pythonpath}
            slurm_env = {**cluster.environment(), "PYTHONPATH": pythonpath,
                         "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
            roots = {"local": base / "local", "slurm": base / "slurm"}
            for root in roots.values():
                root.mkdir()
            envs = {"local": local_env, "slurm": slurm_env}
            out = anyio.run(measure, roots, envs, args.runs, args.seconds, args.calls, log)
        finally:
            slurm_local.down(cluster.directory)
    report(out, args.runs)
    return 0


def report(out: dict[str, Any], runs: int) -> None:
    print(f"tiny run (Regression, 2 epochs of 64 samples), median of {runs}")
    print(f"{'':<28}{'local s':>9}{'slurm s':>9}{'slurm / local':>15}")
    for key, label in (("first", "nitro_train -> progress"), ("end", "nitro_train -> end")):
        lo, sl = statistics.median(out["local"][key]), statistics.median(out["slurm"][key])
        print(f"{label:<28}{lo:>9.2f}{sl:>9.2f}{sl / lo:>14.2f}x")
    first = statistics.median(out["slurm"]["first"]) - statistics.median(out["local"]["first"])
    print(f"RESULT the Slurm executor adds {first:.2f} s before the first progress "
          f"({statistics.median(out['slurm']['first']) / statistics.median(out['local']['first']):.2f}x local)")  # fmt: skip

    st = out["slurm"]["status"]
    base = [v * 1000 for v in out["local"]["status"]["cached"]]
    cached = [v * 1000 for v in st["cached"]]
    queried = [v * 1000 for v in st["queried"]]
    print(f"\nnitro_status on a running job, back to back for {st['seconds']:.1f} s")
    print(f"{'calls':<40}{'n':>5}{'median ms':>11}{'p95 ms':>9}{'max ms':>9}")
    for label, v in (("local (baseline)", base), ("slurm, no engine query", cached),
                     ("slurm, with an engine query", queried)):  # fmt: skip
        if v:
            print(f"{label:<40}{len(v):>5}{statistics.median(v):>11.2f}{pct(v, 0.95):>9.2f}"
                  f"{max(v):>9.2f}")  # fmt: skip
    median = statistics.median(cached)
    ratio = median / statistics.median(base)
    print(f"RESULT nitro_status without an engine query: median {median:.1f} ms, p95 "
          f"{pct(cached, 0.95):.1f} ms (target < 50 ms; {ratio:.2f}x local) "
          f"{'PASS' if median < 50 else 'FAIL'}")  # fmt: skip
    allowed = math.ceil(st["seconds"]) + 1
    rate = st["queries"] / st["seconds"]
    print(f"RESULT engine queries: {st['queries']} in {st['seconds']:.1f} s of status calls "
          f"({rate:.2f} a second; at most {allowed} allowed) "
          f"{'PASS' if st['queries'] <= allowed else 'FAIL'}")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
