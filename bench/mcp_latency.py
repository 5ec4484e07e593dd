"""MCP round trips over a real stdio connection.

Measures, against a `nitro serve` subprocess:
- `nitro_status` round trip (wait_s=0) on a finished job: median and 95th percentile;
- `nitro_train` reply time (the call returns once the job is created and its worker
  spawned, before the worker imports torch): median and max; target median < 0.5 s;
- baseline: `nitro_experiments`' round trip with its cached answer, the cheapest tool
  (the transport's own cost), reported beside them as a ratio.

Run: python bench/mcp_latency.py [--calls 200] [--trains 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import anyio
from mcp import Client, StdioServerParameters


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(root: str, calls: int, trains: int) -> dict[str, list[float]]:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "nitro_mcp.cli", "serve", "--root", root, "--max-jobs", "8"],
        env=dict(os.environ),
    )  # fmt: skip
    out: dict[str, list[float]] = {"train": [], "status": [], "experiments": []}
    async with Client(params) as client:
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
            while (await client.call_tool("nitro_status", {"job_id": job, "wait_s": 10})).structured_content["state"] in (
                "queued", "running"):  # fmt: skip
                pass
        for i in range(calls):
            t = time.perf_counter()
            await client.call_tool("nitro_status", {"job_id": jobs[i % len(jobs)]})
            out["status"].append(time.perf_counter() - t)
            t = time.perf_counter()
            await client.call_tool("nitro_experiments", {})
            out["experiments"].append(time.perf_counter() - t)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--trains", type=int, default=5)
    args = parser.parse_args()
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
