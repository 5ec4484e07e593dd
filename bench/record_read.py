"""Reading a record for resume: ``store.read_record`` of a ~288 MiB AdamW record against
``torch.load`` of the same state dict from the same disk, warm page cache.

Builds an MLP (Linear + LayerNorm blocks) whose parameters and AdamW moments fill
``--size-mb``, encodes it with ``records.encode`` and writes it with ``store.write_record``;
``torch.save`` writes ``{"model": state_dict, "optimizer": state_dict}`` beside it. Both files
are read once first (warm cache), then, interleaved: ``read_record`` with the manifest's
digest (one header parse, every tensor read straight into its own storage, every section
verified: what a resume reads), ``read_record`` of the weights sections alone (what a
``weights=`` load reads), ``torch.load`` (``weights_only=True``, the default) and
``safetensors.torch.load_file`` of the record (no verification) for reference. Medians.

Target (issue 13): read_record (every section) <= 1.0x torch.load.

Run from the repository root:  python bench/record_read.py [--size-mb 288] [--reps 7]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from nitro_core.state import records
from nitro_core.store import recordio as store

TARGET = 1.0
BLOCKS = 24
WEIGHTS = ("params", "buffers", "ema", "tensors")


def build(directory: Path, size_mb: int) -> tuple[Path, Path, str, int]:
    """(record, torch.save file, the record's digest, tensor count)."""
    d = int(math.sqrt(size_mb * 2**20 / (3 * BLOCKS * 4)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.LayerNorm(d)) for _ in range(BLOCKS)]
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():  # the state AdamW's first step creates
        opt.state[p] = {
            "step": torch.tensor(1.0),
            "exp_avg": torch.randn_like(p),
            "exp_avg_sq": torch.rand_like(p),
        }
    header = {"step": 1, "epoch": 1, "seed": 0, "run": "bench001", "metrics": {}}
    snap = records.Snapshot(header=header, model=model, optimizer=opt)
    tensors, meta = records.encode(snap)
    record = directory / "record.safetensors"
    _, digest = store.write_record(record, tensors, meta)
    saved = directory / "state.pt"
    with open(saved, "wb") as f:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    return record, saved, digest, len(tensors)


def measure(size_mb: int, reps: int, directory: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="nitro-bench-", dir=directory) as d:
        record, saved, digest, count = build(Path(d), size_mb)
        readers: dict[str, Callable[[], object]] = {
            "read_record (all)": lambda: store.read_record(record, digest),
            "read_record (weights)": lambda: store.read_record(record, digest, WEIGHTS),
            "torch.load": lambda: torch.load(saved),
            "safetensors load_file": lambda: load_file(str(record)),
        }
        for fn in readers.values():  # warm the page cache
            fn()
        times: dict[str, list[float]] = {name: [] for name in readers}
        names = list(readers)
        for rep in range(reps):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                t = time.perf_counter()
                result = readers[name]()
                times[name].append(time.perf_counter() - t)
                del result
        return {
            "times": times,
            "bytes": record.stat().st_size,
            "torch_bytes": saved.stat().st_size,
            "tensors": count,
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=288)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--dir", help="where the files go (default: the system temp directory)")
    args = p.parse_args()
    figures = measure(args.size_mb, args.reps, args.dir)
    times = figures["times"]
    print(
        f"record {figures['bytes'] / 2**20:.0f} MiB ({figures['tensors']} tensors), torch.save "
        f"file {figures['torch_bytes'] / 2**20:.0f} MiB; {args.reps} reps, warm cache, medians"
    )
    base = statistics.median(times["torch.load"])
    print(f"{'reader':<24}{'median s':>10}{'min s':>8}{'max s':>8}{'x torch.load':>14}")
    for name, t in times.items():
        med = statistics.median(t)
        print(f"{name:<24}{med:>10.3f}{min(t):>8.3f}{max(t):>8.3f}{med / base:>14.2f}")
    ratio = statistics.median(times["read_record (all)"]) / base
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    print(f"RESULT read_record/torch.load = {ratio:.2f} (target <= {TARGET}) {verdict}")


if __name__ == "__main__":
    main()
