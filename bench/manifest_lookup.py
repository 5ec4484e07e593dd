"""The manifest's costs as a run grows: a checkpoint's manifest work, and resolving the latest
and the best record, at 100, 10,000 and 100,000 entries.

For each size, builds ``manifest.json`` with that many ManifestEntry rows (8 runs, metric
'loss', mode 'min', random scores), saved by ``manifest.save`` under ``store.manifest_lock``.
Then, in this process:

  checkpoint    what a checkpoint does to the manifest (``RecordWriter``): read it to
                decide, read it under the lock to claim a name, then under the lock read it,
                add the new entry, drop the oldest (retention) and commit; median over
                ``--commits`` checkpoints, in ms
  rank          ``entries[-1]`` and ``selectors.ranked(entries, "min")[0]`` on the entries
                already read (latest and best), median ms
  lookup cold   ``read_manifest`` + latest + best, first thing in a fresh interpreter that
                has imported nitro_core (one subprocess per repetition), median ms
  json.load     the baseline: ``json.load`` of the same file in that fresh interpreter

The checkpoint figure is the one the issue bounds: at 10,000 entries within 3x its cost at
100; ranking and best/latest over 100,000 entries under 100 ms. Run with the code before the
journal (``PYTHONPATH=old python bench/manifest_lookup.py``) for the "before" figures: the
script uses ``manifest.commit`` when there is one, else load + save as the writer did.

Run from the repository root:  python bench/manifest_lookup.py [--sizes 100,10000,100000]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET_GROWTH, TARGET_RANK_MS = 3.0, 100.0


def entry(i: int, per_run: int, rnd: random.Random) -> Any:
    from nitro_core.store import manifest

    run, epoch = f"{i // per_run:08x}", i % per_run + 1
    score = rnd.uniform(0.01, 2.0)
    digest = (
        {"digest": f"xxh3-128-tree:{rnd.getrandbits(128):032x}"}
        if "digest" in manifest.ManifestEntry.model_fields
        else {"sha256": f"{rnd.getrandbits(256):064x}"}
    )
    return manifest.ManifestEntry(
        file=f"epoch-{epoch:04d}-step-{100 * epoch}-{i}-loss={score:.6g}.safetensors",
        epoch=epoch, step=100 * epoch, score=score, metric="loss", mode="min",
        stop_reason="completed" if epoch == per_run else None, run=run,
        parent=None if run == "00000000" else "00000000/epoch-0001-step-100.safetensors",
        written=f"2026-01-01T00:00:{i % 60:02d}.000Z", bytes=rnd.randrange(1 << 30), **digest,
    )  # fmt: skip


def build(run_dir: Path, n: int, runs: int = 8) -> None:
    from nitro_core.store import manifest
    from nitro_core.store import recordio as store

    rnd = random.Random(0)
    per_run = -(-n // runs)
    entries = [entry(i, per_run, rnd) for i in range(n)]
    with store.manifest_lock(run_dir):
        manifest.save(run_dir, manifest.Manifest(entries=entries))


def checkpoint(run_dir: Path, i: int, rnd: random.Random) -> float:
    """One checkpoint's manifest work, in ms."""
    from nitro_core.store import manifest
    from nitro_core.store import recordio as store

    new = entry(10**7 + i, 10**9, rnd)
    t = time.perf_counter()
    manifest.read_manifest(run_dir)  # decide
    with store.manifest_lock(run_dir):  # claim a name
        manifest.read_manifest(run_dir)
    with store.manifest_lock(run_dir):  # list it, apply retention
        current = manifest.load(run_dir)
        oldest = current.entries[0].file
        if hasattr(manifest, "commit"):
            manifest.commit(run_dir, add=[new], drop=[oldest])
        else:
            current.entries.append(new)
            current.entries = current.entries[1:]
            manifest.save(run_dir, current)
    return 1e3 * (time.perf_counter() - t)


def rank(run_dir: Path) -> float:
    from nitro_core import read_manifest
    from nitro_core.policy.selectors import ranked

    entries = read_manifest(run_dir)
    t = time.perf_counter()
    latest, best = entries[-1], ranked(entries, "min")[0]
    assert latest.epoch > 0 and best.score is not None
    return 1e3 * (time.perf_counter() - t)


def cold(run_dir: Path, what: str) -> float:
    """``what`` timed first thing in a fresh interpreter (after importing nitro_core), ms."""
    cmd = [sys.executable, __file__, "--child", what, str(run_dir)]
    return float(json.loads(subprocess.run(cmd, capture_output=True, check=True).stdout))


def child(what: str, run_dir: Path) -> None:
    import nitro_core  # (same heap as a user's process: torch imported, untimed)
    from nitro_core import read_manifest
    from nitro_core.policy.selectors import ranked

    nitro_core.Nitro  # noqa: B018  (the lazy front door imports torch now, untimed)
    t = time.perf_counter()
    if what == "lookup":
        entries = read_manifest(run_dir)
        entries[-1], ranked(entries, "min")[0]
    else:
        with open(run_dir / "manifest.json", "rb") as f:
            json.load(f)
    print(json.dumps(1e3 * (time.perf_counter() - t)))


def measure(sizes: list[int], commits: int, reps: int) -> dict[int, dict[str, float]]:
    """size -> figure -> median ms."""
    out: dict[int, dict[str, float]] = {}
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="nitro-bench-") as d:
            run_dir = Path(d)
            build(run_dir, n)
            rnd = random.Random(1)
            gc.collect()
            ckpt = [checkpoint(run_dir, i, rnd) for i in range(commits)]
            ranks = [rank(run_dir) for _ in range(max(reps, 3))]
            lookups = [cold(run_dir, "lookup") for _ in range(reps)] or [float("nan")]
            loads = [cold(run_dir, "json") for _ in range(reps)] or [float("nan")]
            size_kib = (run_dir / "manifest.json").stat().st_size / 1024
        out[n] = {
            "checkpoint": statistics.median(ckpt),
            "checkpoint max": max(ckpt),
            "rank": statistics.median(ranks),
            "lookup cold": statistics.median(lookups),
            "json.load": statistics.median(loads),
            "KiB": size_kib,
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="100,10000,100000")
    p.add_argument("--commits", type=int, default=30)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # internal: WHAT DIR
    args = p.parse_args()
    if args.child:
        return child(args.child[0], Path(args.child[1]))
    sizes = [int(s) for s in args.sizes.split(",")]
    figures = measure(sizes, args.commits, args.reps)
    print(f"medians in ms ({args.commits} checkpoints, {args.reps} lookups per size)")
    cols = ("checkpoint", "checkpoint max", "rank", "lookup cold", "json.load", "KiB")
    print(f"{'entries':>9}" + "".join(f"{c:>16}" for c in cols))
    for n, row in figures.items():
        print(f"{n:>9}" + "".join(f"{row[c]:>16.2f}" for c in cols))
    if 100 in figures and 10_000 in figures:
        growth = figures[10_000]["checkpoint"] / figures[100]["checkpoint"]
        verdict = "PASS" if growth <= TARGET_GROWTH else "FAIL"
        print(f"RESULT checkpoint cost at 10,000 / at 100 = {growth:.2f} (target <= 3) {verdict}")
    if 100_000 in figures:
        ms = figures[100_000]["rank"]
        verdict = "PASS" if ms < TARGET_RANK_MS else "FAIL"
        print(f"RESULT latest+best over 100,000 entries = {ms:.1f} ms (target < 100) {verdict}")


if __name__ == "__main__":
    main()
