"""Every benchmark of issue 13 in one run, summarized in one table: the figure, Nitro's value,
the baseline measured in the same run, their ratio, the target, and PASS or FAIL.

Short mode (the default, about two minutes on 2 cores) runs each benchmark on smaller files
with fewer repetitions; ``--full`` runs them at the sizes their own scripts default to
(several minutes and a few GB of disk). Each row names the script that measures it in more
detail. The machine may be shared: every figure is a median of interleaved runs, but read a
ratio near its target as a tie.

Run from the repository root:  python bench/run_all.py [--full]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import averaging  # noqa: E402
import checkpoint_info  # noqa: E402
import digests  # noqa: E402
import manifest_lookup  # noqa: E402
import record_read  # noqa: E402
import record_write  # noqa: E402


@dataclass
class Row:
    figure: str
    nitro: str
    baseline: str
    ratio: float
    target: str
    passed: bool


SIZES = {  # short, full
    "digests": ({"mb": 128, "reps": 3}, {"mb": 256, "reps": 5}),
    "write": ({"size_mb": 192, "reps": 3}, {"size_mb": 256, "reps": 7}),
    "read": ({"size_mb": 192, "reps": 3}, {"size_mb": 288, "reps": 7}),
    "averaging": (
        {"records": 6, "mb": 64, "layers": 8, "repeats": 2},
        {"records": 10, "mb": 100, "layers": 8, "repeats": 3},
    ),
    "manifest": (
        {"sizes": [100, 10_000, 100_000], "commits": 8, "reps": 0},
        {"sizes": [100, 10_000, 100_000], "commits": 30, "reps": 5},
    ),
    "info": (
        {"size_mb": 32, "blocks": 1024, "calls": 10},
        {"size_mb": 256, "blocks": 2048, "calls": 30},
    ),
}


def run_digests(kw: dict) -> list[Row]:
    times = digests.measure(kw["mb"], kw["reps"])
    gb = kw["mb"] * 2**20 / 1e9
    rate = {name: gb / statistics.median(t) for name, t in times.items()}
    disk = rate["write+fsync"]
    rows = []
    for name in ("xxh3-128", "blake3 (1 thread)", "sha256"):
        chosen = name == "xxh3-128"
        rows.append(Row(
            f"hash {name} vs write+fsync (digests.py)", f"{rate[name]:.2f} GB/s",
            f"{disk:.2f} GB/s", rate[name] / disk, "> 2 (chosen)" if chosen else "-",
            rate[name] / disk > 2 if chosen else True,
        ))  # fmt: skip
    return rows


def run_write(kw: dict) -> list[Row]:
    figures = record_write.measure(kw["size_mb"], kw["reps"])
    ratios = record_write.ratios(figures)
    rows = []
    for setting, ratio in ratios.items():
        row = figures[setting]
        mine, plain = (statistics.median(row[n]) for n in ("write_record", "plain write"))
        target = record_write.TARGETS[setting]
        rows.append(Row(
            f"write, {setting}: bandwidth vs plain write+fsync (record_write.py)",
            f"{mine:.3f} s", f"{plain:.3f} s", ratio, f">= {target}", ratio >= target,
        ))  # fmt: skip
    return rows


def run_read(kw: dict) -> list[Row]:
    figures = record_read.measure(kw["size_mb"], kw["reps"])
    times = figures["times"]
    mine, base = (statistics.median(times[n]) for n in ("read_record (all)", "torch.load"))
    return [Row(
        f"read {figures['bytes'] / 2**20:.0f} MiB AdamW record vs torch.load (record_read.py)",
        f"{mine:.3f} s", f"{base:.3f} s", mine / base, "<= 1.0", mine / base <= 1.0,
    )]  # fmt: skip


def run_averaging(kw: dict) -> list[Row]:
    figures = averaging.measure(kw["records"], kw["mb"], kw["layers"], kw["repeats"])
    runs, r = figures["runs"], averaging.ratios(figures)

    def med(setting: str, v: str, key: str = "time") -> float:
        return statistics.median(x[key] for x in runs[setting][v])

    n = kw["records"]
    bound = 3 * figures["params"] / 2**20
    return [
        Row(f"average {n} records, warm vs load_file loop (averaging.py)",
            f"{med('warm', 'nitro'):.3f} s", f"{med('warm', 'load_file'):.3f} s", r["warm"],
            "<= 1.5", r["warm"] <= 1.5),
        Row(f"average {n} records, cold vs reading param bytes (averaging.py)",
            f"{med('cold', 'nitro'):.3f} s", f"{med('cold', 'read params'):.3f} s", r["cold"],
            "<= 1.2", r["cold"] <= 1.2),
        Row("average, peak memory vs params + float64 sum (averaging.py)",
            f"{max(med(s, 'nitro', 'peak') for s in averaging.SETTINGS) / 2**20:.0f} MiB",
            f"{bound:.0f} MiB", r["memory"], "<= 1.0", r["memory"] <= 1.0),
    ]  # fmt: skip


def run_manifest(kw: dict) -> list[Row]:
    figures = manifest_lookup.measure(kw["sizes"], kw["commits"], kw["reps"])
    small, mid, big = (figures[n] for n in kw["sizes"])
    growth = mid["checkpoint"] / small["checkpoint"]
    return [
        Row("manifest work per checkpoint, 10,000 vs 100 entries (manifest_lookup.py)",
            f"{mid['checkpoint']:.1f} ms", f"{small['checkpoint']:.1f} ms", growth, "<= 3",
            growth <= 3),
        Row("manifest work per checkpoint, 100,000 entries (manifest_lookup.py)",
            f"{big['checkpoint']:.1f} ms", f"{small['checkpoint']:.1f} ms",
            big["checkpoint"] / small["checkpoint"], "-", True),
        Row("latest+best over 100,000 entries vs 100 ms (manifest_lookup.py)",
            f"{big['rank']:.1f} ms", "100 ms", big["rank"] / 100, "< 1", big["rank"] < 100),
    ]  # fmt: skip


def run_info(kw: dict) -> list[Row]:
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="nitro-bench-"))
    try:
        path = tmp / "big.safetensors"
        _, count = checkpoint_info.write_big_record(path, kw["size_mb"], kw["blocks"])
        fns = {
            "info": lambda: checkpoint_info.checkpoint_info(path),
            "safe_open": lambda: checkpoint_info.safetensors_metadata(path),
        }
        times: dict[str, list[float]] = {n: [] for n in fns}
        for _ in range(kw["calls"]):
            for name, fn in fns.items():
                t = time.perf_counter()
                fn()
                times[name].append(1e3 * (time.perf_counter() - t))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mine, base = (statistics.median(times[n]) for n in ("info", "safe_open"))
    return [Row(
        f"checkpoint_info, {count} tensors, vs safe_open().metadata() (checkpoint_info.py)",
        f"{mine:.2f} ms", f"{base:.2f} ms", mine / base, "<= 1.2", mine / base <= 1.2,
    )]  # fmt: skip


BENCHES = {
    "digests": run_digests,
    "write": run_write,
    "read": run_read,
    "averaging": run_averaging,
    "manifest": run_manifest,
    "info": run_info,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--full", action="store_true", help="the scripts' own sizes (several minutes)")
    p.add_argument("--only", action="append", choices=sorted(BENCHES), help="run these alone")
    args = p.parse_args()
    started = time.perf_counter()
    rows: list[Row] = []
    for name, run in BENCHES.items():
        if args.only and name not in args.only:
            continue
        rows.extend(run(SIZES[name][1 if args.full else 0]))
    width = max(len(r.figure) for r in rows)
    print(
        f"{'figure':<{width}}  {'nitro':>11}  {'baseline':>11}  {'ratio':>6}  {'target':>12}  result"
    )
    for r in rows:
        verdict = "PASS" if r.passed else "FAIL"
        print(
            f"{r.figure:<{width}}  {r.nitro:>11}  {r.baseline:>11}  {r.ratio:>6.2f}  "
            f"{r.target:>12}  {verdict}"
        )
    mode = "full" if args.full else "short"
    print(
        f"{sum(r.passed for r in rows)} of {len(rows)} pass ({mode} mode, {time.perf_counter() - started:.0f} s)"
    )


if __name__ == "__main__":
    main()
