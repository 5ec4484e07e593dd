"""Record write bandwidth: ``nitro_core.store.recordio.write_record`` against plain file writes,
on a calm machine and under a concurrent CPU load the benchmark makes itself.

Writes a ~256 MiB dict of tensors (four large float32 tensors plus small float32, bfloat16
and int64 ones, under params/, buffers/ and optim/) through ``write_record`` (header with
placeholder digests, the tensors streamed while one helper thread hashes each section with
xxh3-128, the final header put in place, tmp + fsync + rename + directory fsync), beside
(a) the same number of bytes written with plain open/write/flush/fsync and (b) ``torch.save``
of the same state dict followed by flush/fsync. The writers are interleaved (order rotated
each repetition); every file is deleted after it is timed. The whole set runs twice: calm,
then with one busy process (a Python loop spinning on one core) started by the benchmark.

Targets (issue 13): write_record bandwidth / plain-write bandwidth >= 0.95 calm, >= 0.9
under the load.

Run from the repository root:  python bench/record_write.py [--size-mb 256] [--reps 7] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nitro_core.store import recordio as store

TARGETS = {"calm": 0.95, "loaded": 0.9}
NAMES = ("write_record", "plain write", "torch.save")


def make_tensors(size_mb: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    rows = max(1, size_mb * 2**20 // (4 * 4 * 4096))  # four float32 [rows, 4096] tensors
    tensors = {f"params/layer{i}.weight": torch.randn(rows, 4096, generator=g) for i in range(4)}
    for i in range(16):
        tensors[f"params/layer{i}.bias"] = torch.randn(4096, generator=g)
        tensors[f"buffers/norm{i}.scale"] = torch.randn(1024, generator=g).to(torch.bfloat16)
    tensors["optim/state/0/step"] = torch.tensor(1000, dtype=torch.int64)
    return tensors


def write_plain(path: Path, tensors: dict[str, torch.Tensor], total: int) -> int:
    written = 0
    with open(path, "wb") as f:
        for t in tensors.values():
            written += f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        written += f.write(bytes(total - written))  # pad to the record's size (its header)
        f.flush()
        os.fsync(f.fileno())
    return written


def write_torch(path: Path, tensors: dict[str, torch.Tensor]) -> int:
    with open(path, "wb") as f:
        torch.save(tensors, f)
        f.flush()
        os.fsync(f.fileno())
    return path.stat().st_size


def busy() -> subprocess.Popen[bytes]:
    """One process spinning on one core until killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def measure(size_mb: int, reps: int, directory: str | None = None) -> dict[str, dict[str, Any]]:
    """setting -> {writer -> seconds per repetition, "bytes": {writer -> size}}."""
    tensors = make_tensors(size_mb)
    meta = {"step": 1000, "epoch": 4, "seed": 0, "run": "bench0001", "metrics": {"loss": 0.25}}
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="nitro-bench-", dir=directory) as d:
        tmp = Path(d)
        total, _ = store.write_record(tmp / "warm.safetensors", tensors, meta)  # warm-up
        os.unlink(tmp / "warm.safetensors")
        writers: dict[str, Callable[[Path], int]] = {
            "write_record": lambda path: store.write_record(path, tensors, meta)[0],
            "plain write": lambda path: write_plain(path, tensors, total),
            "torch.save": lambda path: write_torch(path, tensors),
        }
        for setting in ("calm", "loaded"):
            load = busy() if setting == "loaded" else None
            try:
                if load is not None:
                    time.sleep(0.3)  # let it reach the scheduler's steady state
                times: dict[str, list[float]] = {name: [] for name in NAMES}
                sizes: dict[str, int] = {}
                for rep in range(reps):
                    order = NAMES[rep % len(NAMES) :] + NAMES[: rep % len(NAMES)]
                    for name in order:
                        path = tmp / f"{name.replace(' ', '_')}.bin"
                        t0 = time.perf_counter()
                        sizes[name] = writers[name](path)
                        times[name].append(time.perf_counter() - t0)
                        os.unlink(path)
                        store.fsync_dir(tmp)
            finally:
                if load is not None:
                    load.kill()
                    load.wait()
            out[setting] = {**times, "bytes": sizes}
    return out


def ratios(figures: dict[str, dict[str, Any]]) -> dict[str, float]:
    """setting -> write_record bandwidth / plain-write bandwidth (medians)."""
    out = {}
    for setting, row in figures.items():
        bw = {n: row["bytes"][n] / statistics.median(row[n]) for n in NAMES}
        out[setting] = bw["write_record"] / bw["plain write"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=256)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--dir", help="where to write (default: the system temp directory)")
    args = p.parse_args()
    figures = measure(args.size_mb, args.reps, args.dir)
    print(f"{args.size_mb} MiB of tensors, {args.reps} reps per setting, fsync on, medians")
    print(
        f"{'setting':<8}{'writer':<14}{'MiB':>8}{'median s':>10}{'MiB/s':>9}{'min s':>8}{'max s':>8}"
    )
    for setting, row in figures.items():
        for name in NAMES:
            med, size = statistics.median(row[name]), row["bytes"][name] / 2**20
            print(
                f"{setting:<8}{name:<14}{size:>8.1f}{med:>10.3f}{size / med:>9.0f}"
                f"{min(row[name]):>8.3f}{max(row[name]):>8.3f}"
            )
    for setting, ratio in ratios(figures).items():
        target = TARGETS[setting]
        verdict = "PASS" if ratio >= target else "FAIL"
        print(
            f"RESULT {setting}: write_record/plain-write bandwidth = {ratio:.3f} "
            f"(target >= {target}) {verdict}"
        )


if __name__ == "__main__":
    main()
