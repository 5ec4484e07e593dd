"""A resume of a large record, against what a plain PyTorch script does to restore the same
state.

One record of about 1 GB (an MLP of 5 layers of 4096 x 4096 and its AdamW state, after one
step) is written once. Then, alternating, ``--reps`` times each:

- Nitro: ``Nitro(exp, run_dir=..., resume="auto")``: the data, the model and its optimizer
  built, the record's header read and every section read, verified and loaded into them;
- plain: the same model and optimizer built by hand (the model's own initialization
  included, as a script does it), ``torch.load(path, mmap=True)`` of the same state saved with
  ``torch.save`` (model and optimizer state dicts), then ``load_state_dict`` of both.

Warm (the files in the page cache) and cold (each file's pages dropped before each run with
``posix_fadvise(DONTNEED)``; a write-back first, so the drop takes). Medians, and the ratio
Nitro / plain (issue 24's target, warm: at most 1.1x). Nitro's setup before its first read is
reported on its own (the model built: skipped initialization since issue 24).

Run from the repository root: python bench/resume_read.py [--reps 5] [--no-cold]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import ClassVar

import torch

from nitro_core import Nitro, read_manifest
from nitro_core.experiment import Experiment, Host
from nitro_core.training.data import TensorBatches


class Big(Experiment):
    """An MLP of ``layers`` square layers of ``width``: 84 M parameters at the defaults."""

    width: int = 4096
    layers: int = 5
    max_epochs: Host[int] = 1
    build_s: ClassVar[list[float]] = []  # each build's seconds

    def build_data(self) -> dict[str, TensorBatches]:
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(8, self.width, generator=g), torch.randn(8, 1, generator=g)
        return {"train": TensorBatches({"x": x, "y": y}, 8)}

    def build_model(self) -> torch.nn.Module:
        start = time.perf_counter()
        mods: list[torch.nn.Module] = []
        for _ in range(self.layers):
            mods += [torch.nn.Linear(self.width, self.width), torch.nn.Tanh()]
        model = torch.nn.Sequential(*mods, torch.nn.Linear(self.width, 1))
        Big.build_s.append(time.perf_counter() - start)
        return model

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])


def drop(path: Path) -> None:
    """Evict ``path``'s pages from the page cache (written back first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def nitro(run_dir: Path) -> tuple[float, float]:
    """(seconds to a resumed handle, seconds of its model build before the first read)."""
    Big.build_s.clear()
    start = time.perf_counter()
    n = Nitro(Big(max_epochs=2), run_dir=run_dir, resume="auto")
    took = time.perf_counter() - start
    assert n.step == 1
    n.close()
    return took, sum(Big.build_s)


def plain(saved: Path, built_first: bool = False) -> float:
    """A script's restore; ``built_first``: the model and optimizer built before the clock
    starts (the read and the load alone)."""
    start = time.perf_counter()
    exp = Big()
    model = exp.build_model()
    optimizer = exp.build_optimizer(model)
    if built_first:
        start = time.perf_counter()
    state = torch.load(saved, mmap=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-cold", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        n = Nitro(Big(), run_dir=run_dir)
        n.train()
        record = run_dir / read_manifest(run_dir)[-1].file
        saved = Path(tmp) / "state.pt"
        torch.save({"model": n.model.state_dict(), "optimizer": n.optimizer.state_dict()}, saved)
        n.close()
        print(
            f"record {record.stat().st_size / 1e9:.2f} GB; torch.save {saved.stat().st_size / 1e9:.2f} GB"
        )
        for mode in ("warm",) + (() if args.no_cold else ("cold",)):
            ours, setup, theirs, loads = [], [], [], []
            nitro(run_dir), plain(saved)  # a first pass: caches, lazy imports
            for _ in range(args.reps):
                if mode == "cold":
                    drop(record), drop(saved)
                took, built = nitro(run_dir)
                ours.append(took)
                setup.append(built)
                if mode == "cold":
                    drop(record), drop(saved)
                theirs.append(plain(saved))
                if mode == "cold":
                    drop(record), drop(saved)
                loads.append(plain(saved, built_first=True))
            a, b, c = (statistics.median(x) for x in (ours, theirs, loads))
            print(f"{mode}: Nitro resume {a:.3f} s (model build {statistics.median(setup):.3f} s); "
                  f"plain build + torch.load(mmap) + load_state_dict {b:.3f} s: {a / b:.2f}x; "
                  f"plain torch.load(mmap) + load_state_dict alone {c:.3f} s: {a / c:.2f}x")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
