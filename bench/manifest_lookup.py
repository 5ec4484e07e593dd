"""Resolving the latest and the best record from a manifest of 10,000 entries.

Builds ``manifest.json`` with ``--entries`` ManifestEntry rows (8 runs, metric 'loss', mode
'min', random scores), saved by ``manifest.save`` under ``store.manifest_lock``. Each
repetition re-reads the file and times ``read_manifest(dir)`` + the latest entry
(``entries[-1]``) + the best (``selectors.ranked(entries, "min")[0]``), beside the baseline
``json.load`` of the same file; ``pick(Best(1), ...)`` is timed on its own. Two settings:
"cold", the first call in a fresh interpreter that has imported nitro_core (one subprocess
per repetition and per measurement, import time excluded), and "warm", repeated calls in
this process. Cyclic-GC pauses land in either and are part of the figures; a third column
repeats "warm" after ``gc.freeze()`` (torch's objects out of the collector's way) to show
how much of the time is full collections. The verdict ignores that column.

Target: median lookup (read + latest + best) under 100 ms, cold and warm.

Run from the repository root:  python bench/manifest_lookup.py [--entries 10000] [--reps 7]
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

TARGET_MS = 100.0


def build(run_dir: Path, n: int, runs: int = 8) -> None:
    from nitro_core.store import manifest
    from nitro_core.store import recordio as store

    rnd = random.Random(0)
    per_run = -(-n // runs)
    entries = []
    for i in range(n):
        run, epoch = f"{i // per_run:08x}", i % per_run + 1
        score = rnd.uniform(0.01, 2.0)
        entries.append(
            manifest.ManifestEntry(
                file=f"epoch-{epoch:04d}-step-{100 * epoch}-loss={score:.6g}.safetensors",
                epoch=epoch,
                step=100 * epoch,
                score=score,
                metric="loss",
                mode="min",
                stop_reason="completed" if epoch == per_run else None,
                run=run,
                parent=None if run == "00000000" else "00000000/epoch-0001-step-100.safetensors",
                written=f"2026-01-01T00:00:{i % 60:02d}.000Z",
                bytes=rnd.randrange(1 << 30),
                sha256=f"{rnd.getrandbits(256):064x}",
            )  # fmt: skip
        )
    with store.manifest_lock(run_dir):
        manifest.save(run_dir, manifest.Manifest(entries=entries))


def lookup(run_dir: Path) -> dict[str, float]:
    """One lookup, in milliseconds per step."""
    from nitro_core import Best, read_manifest
    from nitro_core.policy.selectors import pick, ranked

    t0 = time.perf_counter()
    entries = read_manifest(run_dir)
    t1 = time.perf_counter()
    latest, best = entries[-1], ranked(entries, "min")[0]
    t2 = time.perf_counter()
    (picked,) = pick(Best(1), entries, "min")
    t3 = time.perf_counter()
    assert picked is best and latest.epoch > 0
    ms = {"read_manifest": t1 - t0, "latest+best": t2 - t1, "lookup total": t2 - t0}
    ms["pick(Best(1))"] = t3 - t2
    return {k: 1e3 * v for k, v in ms.items()}


def baseline(run_dir: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    with open(run_dir / "manifest.json", "rb") as f:
        json.load(f)
    return {"json.load": 1e3 * (time.perf_counter() - t0)}


def cold(run_dir: Path, what: str) -> dict[str, float]:
    """``what`` measured first thing in a fresh interpreter (after importing nitro_core)."""
    cmd = [sys.executable, __file__, "--child", what, str(run_dir)]
    return json.loads(subprocess.run(cmd, capture_output=True, check=True).stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=10_000)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # internal: WHAT DIR
    args = p.parse_args()
    if args.child:  # same heap as a user's process: torch and nitro_core imported, untimed
        import nitro_core  # noqa: F401

        what, run_dir = args.child
        print(json.dumps((lookup if what == "lookup" else baseline)(Path(run_dir))))
        return

    with tempfile.TemporaryDirectory(prefix="nitro-bench-") as d:
        run_dir = Path(d)
        build(run_dir, args.entries)
        size_kb = (run_dir / "manifest.json").stat().st_size / 1024
        rows: dict[str, list[dict[str, float]]] = {"cold": [], "warm": [], "frozen": []}
        for _ in range(args.reps):
            rows["cold"].append(cold(run_dir, "lookup") | cold(run_dir, "json"))
            rows["warm"].append(lookup(run_dir) | baseline(run_dir))
        gc.freeze()  # diagnostic: torch's objects out of the collector's way
        for _ in range(args.reps):
            rows["frozen"].append(lookup(run_dir) | baseline(run_dir))
        gc.unfreeze()

    print(f"manifest of {args.entries} entries, {size_kb:.0f} KiB; {args.reps} reps; medians, ms")
    print(f"{'step':<16}{'cold':>9}{'warm':>9}{'warm, gc.freeze()':>19}")
    med = {}
    for name in rows["cold"][0]:
        med[name] = [statistics.median(r[name] for r in rows[k]) for k in rows]
        print(f"{name:<16}{med[name][0]:>9.2f}{med[name][1]:>9.2f}{med[name][2]:>19.2f}")
    worst = max(med["lookup total"][:2])  # the frozen column is a diagnostic only
    ratio = worst / med["json.load"][med["lookup total"].index(worst)]
    verdict = "PASS" if worst < TARGET_MS else "FAIL"
    print(
        f"RESULT lookup median {med['lookup total'][0]:.1f} ms cold, {med['lookup total'][1]:.1f}"
        f" ms warm; {ratio:.1f}x json.load (worse setting); target < {TARGET_MS:g} ms {verdict}"
    )


if __name__ == "__main__":
    main()
