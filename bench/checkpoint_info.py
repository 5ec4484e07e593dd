"""Latency of ``nitro_core.checkpoint_info(path)`` on a ~1 GB record.

Builds a realistic record: a ``--blocks``-block MLP (Linear + LayerNorm; 96 blocks: ~400
layout entries, 1,500 tensors; 2,048 blocks: 24,600 tensors)
sized so params + AdamW state fill ``--size-mb``, encoded by ``records.encode`` with a
header like the handle's (config, history, RNG state, logger, ...), written with
``store.write_record``. Then times ``checkpoint_info`` (header bytes only) over ``--calls``
calls, interleaved with the baseline ``safetensors.safe_open(...).metadata()`` on the same
file (and that plus ``json.loads`` of the nitro metadata, the same work as
checkpoint_info). The page cache cannot be dropped, so these are warm-cache figures.

A record Nitro writes opens its header with its metadata and says how long its data is, so
checkpoint_info parses the metadata alone, not the table of tensors.

Targets: median checkpoint_info under 10 ms, and within 1.2x ``safe_open(...).metadata()``
at any tensor count (issue 13).

Run from the repository root:  python bench/checkpoint_info.py [--size-mb 1024] [--calls 50]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open

from nitro_core import checkpoint_info
from nitro_core.state import records, rng
from nitro_core.store import recordio as store

TARGET_MS, TARGET_RATIO = 10.0, 1.2


def write_big_record(path: Path, size_mb: int, blocks: int = 96) -> tuple[int, int]:
    """Write the record; returns (file bytes, tensor count)."""
    # params + exp_avg + exp_avg_sq = 3 copies of blocks * (d*d + 3d) float32 values
    d = max(4, int(math.sqrt(size_mb * 2**20 / (3 * blocks * 4))))
    with torch.device("meta"):
        model = torch.nn.Sequential(
            *[
                torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.LayerNorm(d))
                for _ in range(blocks)
            ]
        )
    model = model.to_empty(device="cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():  # the state AdamW's first step creates, without the math
        opt.state[p] = {
            "step": torch.tensor(1.0),
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.zeros_like(p),
        }
    rng_json, rng_tensors = rng.capture()
    history = [
        {"epoch": e, "step": 500 * e, "train_loss": 1 / e, "lr": 1e-3, "val": {"loss": 1.1 / e}}
        for e in range(1, 41)
    ]
    header = {
        "step": 20000, "epoch": 40, "seed": 0, "run": "bench001", "parent": None,
        "experiment": "BigMLP", "config": {"width": d, "blocks": blocks, "lr": 1e-3},
        "host_fields": ["max_epochs"], "metrics": {"loss": 0.0275}, "metric": "loss",
        "mode": "min", "stop_reason": "completed", "history": history, "rng": rng_json,
        "logger": {"backend": "jsonl", "state": {"file": "bench001.jsonl", "offset": 9000}},
        "early_stopping": None, "ema_meta": None, "decay_anchor": "zero",
        "w0_checksum": None, "averaged_from": None,
    }  # fmt: skip
    snap = records.Snapshot(header=header, model=model, optimizer=opt, rng_tensors=rng_tensors)
    tensors, meta = records.encode(snap)
    del model, opt, snap
    size, _ = store.write_record(path, tensors, meta)
    return size, len(tensors)


FULL_GCS: list[float] = []


def on_gc(phase: str, info: dict) -> None:
    """Count full collections: a header parse can trigger one in a process holding torch."""
    if phase == "stop" and info["generation"] == 2:
        FULL_GCS.append(time.perf_counter())


def safetensors_metadata(path: Path) -> dict:
    with safe_open(str(path), framework="pt") as f:
        return f.metadata()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument(
        "--blocks", type=int, default=96, help="MLP blocks (4 tensors each, x3 with AdamW)"
    )
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="nitro-bench-"))
    try:
        free = shutil.disk_usage(tmp).free
        if free < args.size_mb * 2**20 + 2**30:
            raise SystemExit(
                f"need {args.size_mb} MiB + 1 GiB free in {tmp}, have {free >> 20} MiB"
            )
        path = tmp / "big.safetensors"
        t0 = time.perf_counter()
        size, count = write_big_record(path, args.size_mb, args.blocks)
        built = time.perf_counter() - t0
        with open(path, "rb") as f:
            header_kb = int.from_bytes(f.read(8), "little") / 1024
        fns = {
            "checkpoint_info": lambda: checkpoint_info(path),
            "safe_open+metadata()": lambda: safetensors_metadata(path),
            "  ...+json.loads(nitro)": lambda: json.loads(safetensors_metadata(path)["nitro"]),
        }
        assert fns["checkpoint_info"]()["layout"] == fns["  ...+json.loads(nitro)"]()["layout"]
        times: dict[str, list[float]] = {name: [] for name in fns}
        gc.callbacks.append(on_gc)
        for _ in range(args.calls):  # interleaved, one call of each per round
            for name, fn in fns.items():
                t = time.perf_counter()
                fn()
                times[name].append(1e3 * (time.perf_counter() - t))
    finally:
        if on_gc in gc.callbacks:
            gc.callbacks.remove(on_gc)
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        f"record {size / 2**20:.0f} MiB, {count} tensors, header {header_kb:.0f} KiB "
        f"(built in {built:.1f} s); {args.calls} calls each, warm page cache"
    )
    print(f"full (generation 2) GC collections during the timed calls: {len(FULL_GCS)}")
    print(f"{'call':<25}{'median ms':>10}{'p90 ms':>8}{'max ms':>8}")
    med = {}
    for name, v in times.items():
        med[name] = statistics.median(v)
        p90 = statistics.quantiles(v, n=10)[-1]
        print(f"{name:<25}{med[name]:>10.3f}{p90:>8.3f}{max(v):>8.3f}")
    ratio = med["checkpoint_info"] / med["safe_open+metadata()"]
    worst = max(times["checkpoint_info"])
    verdict = "PASS" if med["checkpoint_info"] < TARGET_MS and ratio <= TARGET_RATIO else "FAIL"
    print(
        f"RESULT checkpoint_info median {med['checkpoint_info']:.2f} ms = {ratio:.2f}x "
        f"safe_open+metadata() (target <= {TARGET_RATIO}); max {worst:.1f} ms; target median "
        f"< {TARGET_MS:g} ms {verdict}"
    )


if __name__ == "__main__":
    main()
