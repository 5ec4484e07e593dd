"""Hash throughput on this machine: xxh3-128 (``xxhash``), BLAKE3 (``blake3``, one thread and
its own thread pool) and sha256 (``hashlib``), beside a memory copy and a plain write+fsync
of the same bytes, so the choice of the records' section digest can be read off one table.

Each hash runs over ``--mb`` MiB of random bytes in memory, fed in 4 MiB pieces as the
record reader does (so each piece is hashed while it is in the cache), ``--reps`` times,
interleaved; medians are reported in GB/s, with each one's ratio to the disk's write+fsync
rate (above 1: the hash costs less than writing the bytes). The machine may be shared: read
the spread (min and max) beside each median.

Target (issue 13): the chosen digest runs well above disk speed on one core.

Run from the repository root:  python bench/digests.py [--mb 256] [--reps 5]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import blake3
import xxhash

PIECE = 4 * 2**20


def pieces(data: memoryview) -> list[memoryview]:
    return [data[i : i + PIECE] for i in range(0, len(data), PIECE)]


def hashers(data: memoryview) -> dict[str, Callable[[], object]]:
    parts = pieces(data)

    def fed(make: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            h = make()
            for p in parts:
                h.update(p)  # type: ignore[attr-defined]
            return h.digest()  # type: ignore[attr-defined]

        return run

    return {
        "xxh3-128": fed(xxhash.xxh3_128),
        "blake3 (1 thread)": fed(blake3.blake3),
        "blake3 (auto threads)": lambda: blake3.blake3(
            data, max_threads=blake3.blake3.AUTO
        ).digest(),
        "sha256": fed(hashlib.sha256),
        "memcpy": lambda: bytearray(data),
    }


def write_fsync(data: memoryview, directory: str) -> float:
    path = os.path.join(directory, "bench-digests.bin")
    t = time.perf_counter()
    with open(path, "wb") as f:
        for p in pieces(data):
            f.write(p)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - t
    os.unlink(path)
    return elapsed


def measure(mb: int, reps: int, directory: str | None = None) -> dict[str, list[float]]:
    """name -> seconds per repetition (interleaved)."""
    data = memoryview(os.urandom(mb * 2**20))
    fns = hashers(data)
    times: dict[str, list[float]] = {name: [] for name in [*fns, "write+fsync"]}
    with tempfile.TemporaryDirectory(prefix="nitro-bench-", dir=directory) as d:
        for _ in range(reps):
            for name, fn in fns.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
            times["write+fsync"].append(write_fsync(data, d))
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=256)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", help="where the write+fsync goes (default: the temp dir)")
    args = p.parse_args()
    times = measure(args.mb, args.reps, args.dir)
    gb = args.mb * 2**20 / 1e9
    disk = gb / statistics.median(times["write+fsync"])
    print(f"{args.mb} MiB, {args.reps} reps, {os.cpu_count()} cores; medians (min-max), GB/s")
    print(f"{'':<24}{'GB/s':>8}{'min':>8}{'max':>8}{'x disk':>8}")
    for name, t in times.items():
        rate = gb / statistics.median(t)
        print(f"{name:<24}{rate:>8.2f}{gb / max(t):>8.2f}{gb / min(t):>8.2f}{rate / disk:>8.2f}")
    xxh, b3 = (gb / statistics.median(times[n]) for n in ("xxh3-128", "blake3 (1 thread)"))
    verdict = "PASS" if xxh > 2 * disk else "FAIL"
    print(
        f"RESULT xxh3-128 {xxh:.2f} GB/s = {xxh / disk:.1f}x write+fsync, {xxh / b3:.1f}x BLAKE3 "
        f"on one core; target well above disk speed (> 2x) {verdict}"
    )


if __name__ == "__main__":
    main()
