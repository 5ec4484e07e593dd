"""Worker process for test_reliability.py: trains one experiment with nitro_core and exits.

    python _worker.py RUN_DIR --experiment big|regression|classifier|shared
        [--resume auto|false] [--max-epochs N] [--seed N] [--samples N]
        [--hold PATH] [--ready PATH] [--go PATH] [--out PATH]

``--hold``: wait for this file to exist before touching the run directory (so a worker can
import torch while the previous one is still running). ``--ready``: a file touched once the
Nitro handle is set up (the resume, if any, already loaded), just before training starts.
``--go``: wait for this file to exist before training (a start barrier for concurrent
workers). ``--out``: after training,
the final model state and optimizer state, saved with safetensors (optimizer state flattened
as ``optim/<param_idx>/<key>``; epoch, step, run and param_groups in the metadata).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from nitro_core import (
    Best,
    Checkpointer,
    Experiment,
    Host,
    Last,
    Nitro,
    TensorBatches,
)
from nitro_core.examples import Classifier, Regression


class BigRecords(Experiment):
    """A wide linear layer (records of ~50 MB with AdamW) trained on 8 rows: nearly all the
    wall time of an epoch is spent writing its record."""

    width: int = 2048
    rows: int = 8
    lr: float = 1e-2
    max_epochs: Host[int] = 100_000

    def build_data(self) -> dict[str, TensorBatches]:
        g = torch.Generator().manual_seed(7)
        x = torch.randn(2 * self.rows, self.width, generator=g)
        y = torch.randn(2 * self.rows, 1, generator=g)
        train = {"x": x[: self.rows], "y": y[: self.rows]}
        val = {"x": x[self.rows :], "y": y[self.rows :]}
        return {
            "train": TensorBatches(train, self.rows, shuffle=True),
            "val": TensorBatches(val, self.rows),
        }

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Linear(self.width, self.width),
            torch.nn.Tanh(),
            torch.nn.Linear(self.width, 1),
        )

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])

    def checkpointer(self) -> Checkpointer:
        return Checkpointer(keep=(Best(2), Last(2)))


class SharedRegression(Regression):
    """Regression keeping (Best(2), Last(1)) of its own run."""

    def checkpointer(self) -> Checkpointer:
        return Checkpointer(keep=(Best(2), Last(1)), scope="run")


EXPERIMENTS = {
    "big": BigRecords,
    "regression": Regression,
    "classifier": Classifier,
    "shared": SharedRegression,
}


def experiment(args: argparse.Namespace) -> Experiment:
    fields = {}
    if args.max_epochs is not None:
        fields["max_epochs"] = args.max_epochs
    if args.samples is not None:
        fields["samples"] = args.samples
    return EXPERIMENTS[args.experiment](**fields)


def save_final(nitro: Nitro, out: Path) -> None:
    tensors = {f"model/{k}": v.detach().contiguous() for k, v in nitro.model.state_dict().items()}
    state = nitro.optimizer.state_dict()
    for idx, slots in state["state"].items():
        for key, value in slots.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim/{idx}/{key}"] = value.detach().contiguous()
    groups = [{k: v for k, v in g.items()} for g in state["param_groups"]]
    meta = {
        "epoch": str(nitro.epoch),
        "step": str(nitro.step),
        "run": nitro.run_id,
        "param_groups": json.dumps(groups, sort_keys=True),
    }
    save_file(tensors, str(out), metadata=meta)


def wait_for(path: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"worker: {path} did not appear within {timeout:.0f} s")
        time.sleep(0.002)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir", type=Path)
    p.add_argument("--experiment", choices=sorted(EXPERIMENTS), required=True)
    p.add_argument("--resume", choices=("auto", "false"), default="auto")
    p.add_argument("--max-epochs", type=int)
    p.add_argument("--samples", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--hold", type=Path)
    p.add_argument("--ready", type=Path)
    p.add_argument("--go", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    torch.set_num_threads(1)  # the same arithmetic in every process, and no oversubscription
    # warm torch's lazy imports before --hold: an optimizer's first construction imports
    # torch._dynamo (~1.5 s), which a pre-started worker should pay before it is released
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    resume = "auto" if args.resume == "auto" else False
    if args.hold is not None:
        wait_for(args.hold)
    nitro = Nitro(experiment(args), run_dir=args.run_dir, seed=args.seed, resume=resume)
    if args.ready is not None:
        args.ready.touch()
    if args.go is not None:
        wait_for(args.go)
    nitro.train()
    if args.out is not None:
        save_final(nitro, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
