"""Record write bandwidth: ``nitro_core.store.recordio.write_record`` against plain file writes.

Writes a ~256 MB dict of tensors (four large float32 tensors plus some small float32,
bfloat16 and int64 ones) with small metadata through ``write_record`` (streaming writer,
sha256 on a second thread, tmp + fsync + rename + directory fsync), and compares it with
(a) the same number of bytes written with plain open/write/flush/fsync and (b) ``torch.save``
of the same state dict followed by flush/fsync. A fourth row, sha256 of the same bytes in
memory, is the floor of any writer that hashes what it writes. The writers are interleaved
(order rotated each repetition); every file is deleted after it is timed.

Target: median write_record bandwidth / plain-write bandwidth >= 0.7.

Run from the repository root:  python bench/record_write.py [--size-mb 256] [--reps 7] [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from nitro_core.store import recordio as store

TARGET = 0.7


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


def hash_only(tensors: dict[str, torch.Tensor], total: int) -> int:
    """sha256 of the same bytes, no I/O: the floor of a writer that hashes as it writes."""
    sha = hashlib.sha256()
    for t in tensors.values():
        sha.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=256)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--dir", help="where to write (default: the system temp directory)")
    args = p.parse_args()

    tensors = make_tensors(args.size_mb)
    meta = {"step": 1000, "epoch": 4, "seed": 0, "run": "bench0001", "metrics": {"loss": 0.25}}
    names = ["write_record", "plain write", "torch.save", "sha256 only"]
    results: dict[str, list[float]] = {name: [] for name in names}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="nitro-bench-", dir=args.dir) as d:
        tmp = Path(d)
        total, _ = store.write_record(tmp / "warm.safetensors", tensors, meta)  # warm-up
        os.unlink(tmp / "warm.safetensors")
        writers = {
            "write_record": lambda path: store.write_record(path, tensors, meta)[0],
            "plain write": lambda path: write_plain(path, tensors, total),
            "torch.save": lambda path: write_torch(path, tensors),
            "sha256 only": lambda path: hash_only(tensors, total),
        }
        for rep in range(args.reps):
            for name in names[rep % 4 :] + names[: rep % 4]:  # rotate the order
                path = tmp / f"{name.replace(' ', '_')}.bin"
                t0 = time.perf_counter()
                sizes[name] = writers[name](path)
                results[name].append(time.perf_counter() - t0)
                if path.exists():
                    os.unlink(path)
                    store.fsync_dir(tmp)

    print(f"{len(tensors)} tensors, {total / 2**20:.1f} MiB record, {args.reps} reps, fsync on")
    print(f"{'writer':<14}{'MiB':>8}{'median s':>10}{'MiB/s':>9}{'min s':>8}{'max s':>8}")
    bw = {}
    for name, times in results.items():
        med = statistics.median(times)
        bw[name] = sizes[name] / 2**20 / med
        print(
            f"{name:<14}{sizes[name] / 2**20:>8.1f}{med:>10.3f}{bw[name]:>9.0f}"
            f"{min(times):>8.3f}{max(times):>8.3f}"
        )
    ratio = bw["write_record"] / bw["plain write"]
    print(f"write_record / torch.save bandwidth = {bw['write_record'] / bw['torch.save']:.3f}")
    verdict = "PASS" if ratio >= TARGET else "FAIL"
    print(
        f"RESULT ratio write_record/plain-write bandwidth = {ratio:.3f} (target >= {TARGET}) {verdict}"
    )


if __name__ == "__main__":
    main()
