"""Checkpoint averaging: wall time and peak memory of ``average_checkpoints`` over N records,
warm and cold, beside the baselines the issue names, printed side by side in one run.

Builds a run directory in a tempdir holding ``--records`` real records of about ``--mb`` MiB
each: a model of ``--layers`` equal float32 Linear layers plus a BatchNorm1d (whose buffers
include an int64 counter) and its AdamW state (two moments per parameter), so parameters
are a third of each record; written by ``store.write_record`` from ``records.encode`` and
listed in a real ``manifest.json``. Then runs, each in a fresh subprocess so that its peak
resident memory is its own, interleaved, ``--repeats`` times:

  nitro         ``average_checkpoints(run_dir, "latest => Average(Last(N))")``: reads and
                verifies each record's params section only, sums in float64
  load_file     the plain safetensors loop: ``safetensors.torch.load_file`` of each record,
                its params added into a float64 sum (nothing verified)
  read params   reads the params bytes of each record with plain ``preadv`` calls and
                discards them (the time to read what an average needs)

in two settings: warm (every file in the page cache) and cold (each file evicted with
``posix_fadvise(DONTNEED)`` before each child, so everything is read from disk).

Peak memory is VmHWM (reset through /proc/self/clear_refs after the imports) minus VmRSS
after the imports, cross-checked by VmRSS sampled every 2 ms; mapped record pages count as
resident. It is shown beside one record's parameters plus the float64 sum (3x the float32
parameter bytes), the issue's bound.

Targets (issue 13): warm nitro <= 1.5x the load_file loop; cold nitro <= 1.2x reading the
parameter bytes; nitro's peak <= one record's parameters + the float64 sum.

Run from the repository root:  python bench/averaging.py [--records 10] [--mb 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TARGET_WARM, TARGET_COLD, TARGET_MEM = 1.5, 1.2, 1.0
VARIANTS = ("nitro", "load_file", "read params")
SETTINGS = ("warm", "cold")
MB = 2**20


def rss() -> dict[str, int]:
    """VmRSS, VmHWM (its peak), RssAnon and RssFile of this process, in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    return out


class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.done = rss(), threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.002):
            for key, value in rss().items():
                self.peak[key] = max(self.peak[key], value)


def param_ranges(path: Path) -> list[tuple[int, int]]:
    """File offsets (begin, end) of each params/ tensor."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return [
        (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
        for k, v in header.items()
        if k.startswith("params/")
    ]


def child(variant: str, run_dir: Path, n: int) -> None:
    import torch
    from safetensors.torch import load_file

    from nitro_core.averaging import average_checkpoints
    from nitro_core.store import manifest

    files = [run_dir / e.file for e in manifest.read_manifest(run_dir)][-n:]
    ranges = {p: param_ranges(p) for p in files} if variant == "read params" else {}
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS: the import peak is not counted
        hwm_reset = True
    except OSError:
        hwm_reset = False  # then the sampled VmRSS is the measure (VmHWM keeps the import peak)
    base = rss()
    sampler = Sampler()
    sampler.start()
    t0 = time.perf_counter()
    means: dict[str, torch.Tensor] = {}
    if variant == "read params":
        buf = memoryview(bytearray(8 * MB))
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            for begin, end in ranges[path]:
                for at in range(begin, end, len(buf)):
                    os.preadv(fd, [buf[: min(len(buf), end - at)]], at)
            os.close(fd)
    elif variant == "nitro":
        result = average_checkpoints(run_dir, f"latest => Average(Last({n}))")
        means = {k: result.state[k] for k, _, _ in result.meta["layout"]["params"]}
    else:
        sums: dict[str, torch.Tensor] = {}
        for path in files:
            record = load_file(str(path))
            for key, t in record.items():
                if key.startswith("params/") and t.is_floating_point():
                    if key not in sums:
                        sums[key] = torch.zeros(t.shape, dtype=torch.float64)
                    sums[key].add_(t)
            del record
        means = {k.removeprefix("params/"): (v / len(files)).float() for k, v in sums.items()}
    elapsed = time.perf_counter() - t0
    sampler.done.set()
    sampler.join()
    hwm = rss()["VmHWM"]
    checksum = sum(float(t.double().sum()) for t in means.values())
    print(json.dumps({
        "time": elapsed, "peak": max(hwm if hwm_reset else 0, sampler.peak["VmRSS"]) - base["VmRSS"],
        "anon": sampler.peak["RssAnon"] - base["RssAnon"], "file": sampler.peak["RssFile"] - base["RssFile"],
        "base": base["VmRSS"], "checksum": checksum,
    }))  # fmt: skip


def build(run_dir: Path, n: int, mb: int, layers: int) -> tuple[int, int]:
    """Write ``n`` records and their manifest; returns (record bytes, parameter bytes)."""
    import torch

    from nitro_core.state import records
    from nitro_core.store import manifest
    from nitro_core.store import recordio as store
    from nitro_core.store.manifest import ManifestEntry
    from nitro_core.training import checkpointing

    d = int((mb * MB / 12 / layers) ** 0.5)  # params + two AdamW moments, float32
    model = torch.nn.Sequential(*(torch.nn.Linear(d, d) for _ in range(layers)))
    model.append(torch.nn.BatchNorm1d(d))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for p in model.parameters():
        opt.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p),
                        "exp_avg_sq": torch.zeros_like(p)}  # fmt: skip
    entries = []
    for epoch in range(1, n + 1):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
            model[-1].num_batches_tracked.fill_(100 * epoch)
        score, step = 1.0 / epoch, 100 * epoch
        header = {"step": step, "epoch": epoch, "seed": 0, "run": "bench001", "config": {},
                  "metrics": {"loss": score}, "stop_reason": None, "ema_meta": None}  # fmt: skip
        tensors, meta = records.encode(records.Snapshot(header=header, model=model, optimizer=opt))
        name = checkpointing.record_name(epoch, step, score, "loss", None)
        size, digest = store.write_record(run_dir / name, tensors, meta)
        entries.append(ManifestEntry(
            file=name, epoch=epoch, step=step, score=score, metric="loss", mode="min",
            stop_reason=None, run="bench001", written=manifest.now_iso(), bytes=size, digest=digest,
        ))  # fmt: skip
    with store.manifest_lock(run_dir):
        manifest.save(run_dir, manifest.Manifest(entries=entries))
    params = sum(p.numel() * 4 for p in model.parameters())
    return size, params


def evict(run_dir: Path) -> None:
    for path in run_dir.glob("*.safetensors"):
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def warm_up(run_dir: Path) -> None:
    for path in run_dir.glob("*.safetensors"):
        with open(path, "rb", buffering=0) as f:
            while f.read(8 * MB):
                pass


def measure(records: int, mb: int, layers: int, repeats: int) -> dict[str, Any]:
    """{"runs": {setting: {variant: [child results]}}, "record": bytes, "params": bytes}."""
    tmp = Path(tempfile.mkdtemp(prefix="nitro-bench-avg-", dir=os.environ.get("BENCH_DIR")))
    try:
        need = records * mb * MB * 1.1 + 2**30
        if shutil.disk_usage(tmp).free < need:
            sys.exit(f"need {need / 2**30:.1f} GiB free in {tmp}")
        run_dir = tmp / "run"
        run_dir.mkdir()
        record, params = build(run_dir, records, mb, layers)
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {
            s: {v: [] for v in VARIANTS} for s in SETTINGS
        }
        for _ in range(repeats):
            for setting in SETTINGS:
                for v in VARIANTS:
                    if setting == "cold":
                        evict(run_dir)
                    else:
                        warm_up(run_dir)
                    cmd = [sys.executable, __file__, "--records", str(records), "--child", v]
                    out = subprocess.run([*cmd, str(run_dir)], capture_output=True, text=True)
                    if out.returncode:
                        sys.exit(f"{v} failed:\n{out.stderr}")
                    runs[setting][v].append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"runs": runs, "record": record, "params": params}


def ratios(figures: dict[str, Any]) -> dict[str, float]:
    """warm: nitro / load_file; cold: nitro / read params; memory: nitro peak / bound."""
    runs = figures["runs"]

    def med(setting: str, v: str, key: str = "time") -> float:
        return statistics.median(r[key] for r in runs[setting][v])

    bound = 3 * figures["params"]  # one record's float32 parameters + their float64 sum
    return {
        "warm": med("warm", "nitro") / med("warm", "load_file"),
        "cold": med("cold", "nitro") / med("cold", "read params"),
        "memory": max(med(s, "nitro", "peak") for s in SETTINGS) / bound,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=10)
    p.add_argument("--mb", type=int, default=100)
    p.add_argument("--layers", type=int, default=8, help="Linear layers (largest tensor = 1/L)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", nargs=2, metavar=("VARIANT", "RUN_DIR"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child[0], Path(args.child[1]), args.records)
    figures = measure(args.records, args.mb, args.layers, args.repeats)
    runs = figures["runs"]
    print(
        f"{args.records} records of {figures['record'] / MB:.1f} MiB (parameters "
        f"{figures['params'] / MB:.1f} MiB each), {args.repeats} repeats, medians; bound on "
        f"memory: parameters + float64 sum = {3 * figures['params'] / MB:.0f} MiB"
    )
    print(
        f"{'setting':<8}{'variant':<13}{'median s':>9}{'min s':>8}{'max s':>8}{'peak MiB':>9}{'anon':>7}{'file':>7}"
    )
    for setting in SETTINGS:
        for v in VARIANTS:
            rows = runs[setting][v]
            t = [r["time"] for r in rows]
            peak, anon, fil = (
                statistics.median(r[k] for r in rows) / MB for k in ("peak", "anon", "file")
            )
            print(f"{setting:<8}{v:<13}{statistics.median(t):>9.3f}{min(t):>8.3f}{max(t):>8.3f}{peak:>9.0f}{anon:>7.0f}{fil:>7.0f}")  # fmt: skip
    a, b = runs["warm"]["nitro"][0]["checksum"], runs["warm"]["load_file"][0]["checksum"]
    print(f"checksum of the means: nitro {a:.9e}, load_file {b:.9e}")
    r = ratios(figures)
    for label, target in (("warm", TARGET_WARM), ("cold", TARGET_COLD), ("memory", TARGET_MEM)):
        what = {"warm": "nitro/load_file loop (warm)", "cold": "nitro/read params (cold)",
                "memory": "nitro peak/(params + float64 sum)"}[label]  # fmt: skip
        verdict = "PASS" if r[label] <= target else "FAIL"
        print(f"RESULT {what} = {r[label]:.2f} (target <= {target}) {verdict}")


if __name__ == "__main__":
    main()
