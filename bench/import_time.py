"""`nitro --help` and `import nitro_core` wall time against `python -c pass`, in the same run.

Each command runs in a fresh interpreter, interleaved, ``--reps`` times; the medians and
their ratio to the empty interpreter are printed. The target is `nitro --help` under 0.5 s
(issue 9); before the lazy imports it loaded torch and took several seconds.

    python bench/import_time.py [--reps 7]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    nitro = shutil.which("nitro")
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import nitro_core.errors": [sys.executable, "-c", "import nitro_core.errors"],
        "import nitro_core": [sys.executable, "-c", "import nitro_core"],
        "nitro --help": [nitro, "--help"]
        if nitro
        else [sys.executable, "-m", "nitro_mcp", "--help"],
        "import torch (reference)": [sys.executable, "-c", "import torch"],
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.reps):  # interleaved, so load drifts hit every case alike
        for name, cmd in cases.items():
            times[name].append(wall(cmd))
    base = statistics.median(times["python -c pass"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:28s} median {med * 1000:8.1f} ms  x{med / base:5.2f} of python -c pass")
    helpt = statistics.median(times["nitro --help"])
    print(f"nitro --help: {helpt:.3f} s (target < 0.5 s): {'ok' if helpt < 0.5 else 'MISSED'}")


if __name__ == "__main__":
    main()
