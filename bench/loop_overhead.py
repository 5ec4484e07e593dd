"""Nitro training-loop overhead against a hand-written PyTorch loop.

Measures the wall time of ``Nitro(exp).train()`` (checkpointing off: ``checkpointer()``
returns None; no 'val' split, so no validation; ``NullLogger``) against a plain loop
``loss = ...; opt.zero_grad(set_to_none=True); loss.backward(); opt.step()`` over the same
MLP (256-256-256-10, ~2 ms a step on one thread), the same ``TensorBatches(shuffle=True)``
data, AdamW and seed. Runs are interleaved in ABBA order (Nitro, hand, hand, Nitro, ...) to
cancel drift; construction is timed separately. Both loops must end with bit-identical
weights, which checks that they do the same work. On a shared machine the ratio moves by
several percent from run to run: raise --reps to tighten it. The loops' thread CPU time is
reported beside the wall time: both run on one thread, so it counts the same work without
the time another process held the core (the figure to trust on a busy machine).

Target: median Nitro / hand-written wall time <= 1.03 (issue 11: the training-step hooks at
their defaults cost nothing per step).

Run from the repository root:  python bench/loop_overhead.py [--reps 25] [--epochs 2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time

import torch

from nitro_core import (
    Experiment,
    Nitro,
    NullLogger,
    TensorBatches,
)

TARGET = 1.03


class MLPBench(Experiment):
    features: int = 256
    hidden: int = 256
    classes: int = 10
    samples: int = 10240
    batch_size: int = 128
    lr: float = 1e-3
    max_epochs: int = 4

    def build_data(self) -> dict[str, TensorBatches]:
        g = torch.Generator().manual_seed(1234)
        x = torch.randn(self.samples, self.features, generator=g)
        y = torch.randint(0, self.classes, (self.samples,), generator=g)
        return {"train": TensorBatches({"x": x, "y": y}, self.batch_size, shuffle=True)}

    def build_model(self) -> torch.nn.Module:
        h = self.hidden
        return torch.nn.Sequential(
            torch.nn.Linear(self.features, h), torch.nn.ReLU(),
            torch.nn.Linear(h, h), torch.nn.ReLU(),
            torch.nn.Linear(h, self.classes),
        )  # fmt: skip

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])

    def checkpointer(self) -> None:
        return None

    def logger(self) -> NullLogger:
        return NullLogger()


Timed = tuple[float, float, float, torch.nn.Module]  # build s, train s, train CPU s, model


def run_nitro(exp: MLPBench, run_dir: str, seed: int) -> Timed:
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):  # no progress bar, even on a terminal
        n = Nitro(exp, run_dir=run_dir, seed=seed, device="cpu")
    t1, c1 = time.perf_counter(), time.thread_time()
    n.train()
    return t1 - t0, time.perf_counter() - t1, time.thread_time() - c1, n.model


def run_hand(exp: MLPBench, seed: int) -> Timed:
    t0 = time.perf_counter()
    torch.manual_seed(seed)  # same draw order as Nitro: data, model, optimizer, shuffles
    data = exp.build_data()["train"]
    model = exp.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=exp.lr)
    t1, c1 = time.perf_counter(), time.thread_time()
    model.train()
    for _ in range(exp.max_epochs):
        for batch in data:
            loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return t1 - t0, time.perf_counter() - t1, time.thread_time() - c1, model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=25)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=10240, help="rows (batch 128)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    exp = MLPBench(max_epochs=args.epochs, samples=args.samples)
    steps = args.epochs * len(exp.build_data()["train"])
    times: dict[str, list[float]] = {"nitro": [], "hand": []}
    cpu: dict[str, list[float]] = {"nitro": [], "hand": []}
    builds: dict[str, list[float]] = {"nitro": [], "hand": []}
    models: dict[str, torch.nn.Module] = {}
    with tempfile.TemporaryDirectory(prefix="nitro-bench-") as tmp:
        runners = {
            "nitro": lambda: run_nitro(exp, tmp, args.seed),
            "hand": lambda: run_hand(exp, args.seed),
        }
        runners["nitro"](), runners["hand"]()  # warm-up, untimed
        for i in range(args.reps):
            # ABBA order: neither loop always runs first
            for k in ("nitro", "hand") if i % 2 == 0 else ("hand", "nitro"):
                build, train, train_cpu, models[k] = runners[k]()
                builds[k].append(build)
                times[k].append(train)
                cpu[k].append(train_cpu)
    pairs = zip(models["nitro"].state_dict().values(), models["hand"].state_dict().values())
    same = all(torch.equal(a, b) for a, b in pairs)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"MLP 256-256-256-10, batch 128, {steps} steps/run, {args.threads} thread(s), {args.reps} reps"
    )
    print(
        f"{'loop':<13}{'train s':>10}{'ms/step':>10}{'min s':>9}{'max s':>9}{'CPU ms/step':>13}"
        f"{'build ms':>10}"
    )
    for k, label in (("hand", "hand-written"), ("nitro", "Nitro")):
        v = times[k]
        print(
            f"{label:<13}{med[k]:>10.3f}{1e3 * med[k] / steps:>10.3f}{min(v):>9.3f}{max(v):>9.3f}"
            f"{1e3 * statistics.median(cpu[k]) / steps:>13.3f}"
            f"{1e3 * statistics.median(builds[k]):>10.1f}"
        )
    ratios = [a / b for a, b in zip(times["nitro"], times["hand"])]
    print(
        f"per-pair ratio: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-"
        f"{max(ratios):.3f}; ratio of minima {min(times['nitro']) / min(times['hand']):.3f}"
    )
    cpu_ratios = [a / b for a, b in zip(cpu["nitro"], cpu["hand"])]
    print(
        f"thread CPU time: ratio of medians "
        f"{statistics.median(cpu['nitro']) / statistics.median(cpu['hand']):.3f}, per-pair "
        f"median {statistics.median(cpu_ratios):.3f}, range {min(cpu_ratios):.3f}-"
        f"{max(cpu_ratios):.3f}"
    )
    print(f"final weights identical: {same}")
    ratio = med["nitro"] / med["hand"]
    verdict = "PASS" if ratio <= TARGET and same else "FAIL"
    print(f"RESULT ratio Nitro/hand-written = {ratio:.3f} (target <= {TARGET}) {verdict}")


if __name__ == "__main__":
    main()
