"""Mid-epoch resume: the time from ``Nitro(resume="auto")`` to the first training step, as a
function of where in the epoch the record was written.

A long epoch (``--batches``, 2,049 by default: records at 0, 25, 50, 75 and ~100% of it)
of a cheap model (``Linear(8, 1)``), so that the data costs dominate: every split pays
``--batch-ms`` of sleep per batch it produces (a decode or augmentation; a sleep, so the
figure does not depend on how busy a shared machine's cores are). Four train splits:

- O(1) path, the split says where it is (``state_dict()``/``load_state_dict()``):
  ``TensorBatches`` and torchdata's ``StatefulDataLoader`` (fast-forwards its sampler
  without fetching the skipped batches);
- replay path, a plain re-iterable: a torch ``DataLoader`` and a generator-backed class,
  whose first ``batch`` batches of the epoch are read again and skipped.

For each split and position a run is trained until its point there (a mid-epoch record,
or at 0% the previous epoch's end record) and stopped; then ``Nitro(exp, resume="auto")``
is built and trained until its loss is first called in training mode, which ends the
measurement (the run is interrupted there and writes nothing, so the same record serves
every repetition). Repetitions are interleaved over splits and positions; medians.

Expected: the O(1) lines flat (construction, reading the record: they grow by at most 5% of
a batch's data cost per batch of position; a ``StatefulDataLoader`` steps its sampler past
the consumed indices, which is O(position) with a small constant), the replay lines linear
in the position (at least ``--batch-ms`` per batch of position, the data read again).

Run from the repository root:  python bench/resume_position.py [--quick] [--reps 3]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import torch

from nitro_core import (
    Checkpointer,
    Experiment,
    Host,
    Last,
    Nitro,
    NitroWarning,
    NullLogger,
    TensorBatches,
)

Split = Literal["tensor", "stateful", "loader", "generator"]
LABELS = {
    "tensor": "TensorBatches",
    "stateful": "StatefulDataLoader",
    "loader": "replay DataLoader",
    "generator": "replay generator",
}
BATCH = 16
FLAT = 0.05  # O(1): growth per batch of position, at most this share of a batch's data cost
LINEAR = 0.95  # replay: correlation of time with position, at least


class SlowTensorBatches(TensorBatches):
    """TensorBatches paying ``cost`` seconds per batch it yields."""

    def __init__(self, tensors: dict[str, torch.Tensor], cost: float) -> None:
        super().__init__(tensors, BATCH, shuffle=True)
        self.cost = cost

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for batch in super().__iter__():
            time.sleep(self.cost)
            yield batch


class SlowCollate:
    """A DataLoader's collate_fn paying ``cost`` seconds per batch."""

    def __init__(self, cost: float) -> None:
        self.cost = cost

    def __call__(self, samples: list[Any]) -> Any:
        time.sleep(self.cost)
        return torch.utils.data.default_collate(samples)


class Generated:
    """A generator-backed re-iterable without state_dict(): shuffles from the global
    generator at each pass and pays ``cost`` seconds per batch."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, cost: float) -> None:
        self.x, self.y, self.cost = x, y, cost

    def __len__(self) -> int:
        return -(-len(self.x) // BATCH)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.randperm(len(self.x))
        for first in range(0, len(self.x), BATCH):
            idx = order[first : first + BATCH]
            time.sleep(self.cost)
            yield self.x[idx], self.y[idx]


class Stream(Experiment):
    """One long epoch of a cheap model; a point every ``every`` steps."""

    split: Split = "tensor"
    batches: int = 2049
    every: int = 512
    batch_ms: float = 0.5
    max_epochs: Host[int] = 1  # the 0% resume continues into epoch 2

    def build_data(self) -> dict[str, Any]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.batches * BATCH, 8, generator=g)
        y = x.sum(1, keepdim=True)
        cost = self.batch_ms / 1e3
        if self.split == "tensor":
            return {"train": SlowTensorBatches({"x": x, "y": y}, cost)}
        if self.split == "generator":
            return {"train": Generated(x, y, cost)}
        dataset = torch.utils.data.TensorDataset(x, y)
        if self.split == "stateful":
            from torchdata.stateful_dataloader import (  # type: ignore[import-untyped]
                StatefulDataLoader,
            )

            loader: Any = StatefulDataLoader(
                dataset, batch_size=BATCH, shuffle=True, collate_fn=SlowCollate(cost)
            )
        else:
            loader = torch.utils.data.DataLoader(
                dataset, batch_size=BATCH, shuffle=True, collate_fn=SlowCollate(cost)
            )
        return {"train": loader}

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Linear(8, 1)

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
        return torch.nn.functional.mse_loss(model(x), y)

    def checkpointer(self) -> Checkpointer:
        return Checkpointer(keep=Last(1), every_steps=self.every, async_write=False)

    def logger(self) -> NullLogger:
        return NullLogger()


class FirstStep(Exception):
    """Raised by the measured run's first training loss: the measurement ends there."""


def on_training_loss(n: Nitro, step: int, action: Any) -> None:
    """Call ``action()`` when ``n`` computes the loss of its ``step``-th training batch of
    this train() (1-based)."""
    original = n.experiment.loss
    calls = [0]

    def loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        if model.training:
            calls[0] += 1
            if calls[0] == step:
                action()
        return original(model, batch)

    object.__setattr__(n.experiment, "loss", loss)


def prepare(exp: Stream, run_dir: Path, batch: int) -> None:
    """Train ``run_dir`` until its record at ``batch`` of epoch 1 (0: epoch 1's end)."""
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", NitroWarning)
        n = Nitro(exp, run_dir=run_dir)
        if batch:
            on_training_loss(n, batch, n.request_stop)  # the point after this step stops it
        n.train()
    assert (n.epoch, n.batch) == (1, batch or None), (n.epoch, n.batch)


def time_to_first_step(exp: Stream, run_dir: Path) -> float:
    """Seconds from Nitro(resume="auto") to the resumed run's first training loss."""
    first: list[float] = []

    def stop() -> None:
        first.append(time.perf_counter())
        raise FirstStep

    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", NitroWarning)  # the replay path says what it costs
        t0 = time.perf_counter()
        n = Nitro(exp.model_copy(update={"max_epochs": 2}), run_dir=run_dir, resume="auto")
        on_training_loss(n, 1, stop)
        with contextlib.suppress(FirstStep):
            n.train()
    return first[0] - t0


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(slope, correlation) of ys against xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / sxx, (sxy / (sxx * syy) ** 0.5 if syy else 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quarter", type=int, default=512, help="batches per quarter of the epoch")
    p.add_argument("--batch-ms", type=float, default=0.5, help="data cost per batch, ms")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="128-batch quarters, 2 repetitions")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    if args.quick:
        args.quarter, args.reps = 128, 2
    torch.set_num_threads(args.threads)
    splits: list[Split] = ["tensor", "stateful", "loader", "generator"]
    if importlib.util.find_spec("torchdata") is None:
        splits.remove("stateful")
        print("(torchdata is not installed: no StatefulDataLoader line)")
    q = args.quarter
    batches = 4 * q + 1  # records at q, 2q, 3q and 4q = the epoch's last batch but one
    positions = [0, q, 2 * q, 3 * q, 4 * q]
    times: dict[tuple[str, int], list[float]] = {(s, b): [] for s in splits for b in positions}
    with tempfile.TemporaryDirectory(prefix="nitro-resume-") as tmp:
        exps = {
            s: Stream(split=s, batches=batches, every=q, batch_ms=args.batch_ms) for s in splits
        }
        t0 = time.perf_counter()
        for s in splits:
            for b in positions:
                prepare(exps[s], Path(tmp) / f"{s}-{b}", b)
        setup_s = time.perf_counter() - t0
        for i in range(args.reps):
            for b in positions if i % 2 == 0 else positions[::-1]:
                for s in splits if i % 2 == 0 else splits[::-1]:
                    times[s, b].append(time_to_first_step(exps[s], Path(tmp) / f"{s}-{b}"))
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}

    print(
        f"Resume to the first training step: an epoch of {batches} batches of {BATCH} rows, "
        f"{args.batch_ms} ms of data cost per batch, Linear(8, 1); median of {args.reps} "
        f"(records prepared in {setup_s:.0f} s)"
    )
    print(f"{'position':<16}" + "".join(f"{LABELS[s]:>20}" for s in splits) + "   (ms)")
    for b in positions:
        where = f"{100 * b / batches:3.0f}% (b {b})"
        print(f"{where:<16}" + "".join(f"{med[s, b]:>20.1f}" for s in splits))
    verdicts = []
    for s in splits:
        ys = [med[s, b] for b in positions]
        slope, r = fit([float(b) for b in positions], ys)  # ms per batch of position
        share = slope / args.batch_ms  # of what reading a batch costs
        if s in ("tensor", "stateful"):
            ok = share <= FLAT
            print(
                f"RESULT {LABELS[s]} (O(1)): {1e3 * slope:+.1f} us per batch of position = "
                f"{100 * share:.1f}% of a batch's data cost (flat: <= {100 * FLAT:.0f}%), "
                f"100% / 0% = {ys[-1] / ys[0]:.2f} {'PASS' if ok else 'FAIL'}"
            )
        else:
            ok = r >= LINEAR
            print(
                f"RESULT {LABELS[s]} (replay): {1e3 * slope:.0f} us per batch of position = "
                f"{share:.2f}x a batch's data cost, correlation {r:.3f} (linear: >= {LINEAR}) "
                f"{'PASS' if ok else 'FAIL'}"
            )
        verdicts.append(ok)
    print(f"RESULT O(1) flat and replay linear: {'PASS' if all(verdicts) else 'FAIL'}")


if __name__ == "__main__":
    main()
