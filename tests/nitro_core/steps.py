"""Experiments with checkpoint points inside epochs, for the step-granularity tests (and the
``_points_worker.py`` subprocess): a small MLP with dropout and a one-cycle schedule, whose
train split is a ``TensorBatches`` (O(1) data position), a plain re-iterable (replayed on
a mid-epoch resume) or torchdata's ``StatefulDataLoader``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import torch

from nitro_core import Checkpointer, Experiment, Host, Last, TensorBatches

Split = Literal["tensor", "plain", "stateful0", "stateful2"]


class PlainBatches:
    """A re-iterable without ``state_dict``: shuffles from the global generator when a pass
    starts, and adds noise drawn from it to every batch (an augmentation in the main
    process), so a replay must restore the epoch's generators to be exact."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> None:
        self.x, self.y, self.batch_size = x, y, batch_size
        self.passes = 0  # passes started: a test counts the replays

    def __len__(self) -> int:
        return -(-len(self.x) // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        self.passes += 1
        order = torch.randperm(len(self.x))
        for first in range(0, len(self.x), self.batch_size):
            idx = order[first : first + self.batch_size]
            x = self.x[idx]
            yield {"x": x + 0.01 * torch.randn_like(x), "y": self.y[idx]}


def stateful_loader(x: torch.Tensor, y: torch.Tensor, batch_size: int, workers: int) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader

    dataset = torch.utils.data.TensorDataset(x, y)
    return StatefulDataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)


class Steps(Experiment):
    """y = sum(x) + noise on ``rows`` rows in batches of ``batch``: with the defaults 8
    batches an epoch and a point every 3 optimizer steps (steps 3, 6, 8 | 9, 12, 15, 16 |
    ...)."""

    split: Split = "tensor"
    rows: int = 32
    batch: int = 4
    width: int = 6
    hidden: int = 16
    every: int | None = 3
    keep: int = 2
    async_write: bool = True
    schedule: bool = True  # a one-cycle schedule over max_epochs (fixed: not a Host field)
    lr: float = 0.05
    max_epochs: Host[int] = 3

    def build_data(self) -> dict[str, Any]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.rows + 16, self.width, generator=g)
        y = x.sum(1, keepdim=True) + 0.1 * torch.randn(self.rows + 16, 1, generator=g)
        tx, ty, vx, vy = x[: self.rows], y[: self.rows], x[self.rows :], y[self.rows :]
        if self.split == "tensor":
            train: Any = TensorBatches({"x": tx, "y": ty}, self.batch, shuffle=True)
        elif self.split == "plain":
            train = PlainBatches(tx, ty, self.batch)
        else:
            train = stateful_loader(tx, ty, self.batch, int(self.split[-1]))
        # a shuffled val split draws from the global generator: evaluation must not move it
        return {"train": train, "val": TensorBatches({"x": vx, "y": vy}, 8, shuffle=True)}

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Linear(self.width, self.hidden),
            torch.nn.Dropout(0.2),
            torch.nn.Linear(self.hidden, 1),
        )

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
        return torch.nn.functional.mse_loss(model(x), y)

    def lr_scheduler(self, optimizer: torch.optim.Optimizer, total_steps: int | None) -> Any:
        if not self.schedule:
            return None
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=self.lr, total_steps=total_steps
        )

    def checkpointer(self) -> Checkpointer:
        return Checkpointer(
            keep=Last(self.keep), every_steps=self.every, async_write=self.async_write
        )


def stop_at_step(n: Any, step: int) -> None:
    """Make ``n`` request a stop while it trains optimizer step ``step`` (the point that
    follows it stops the run): a user's Ctrl+C at that moment."""
    original = n.experiment.loss
    calls = [n.step]

    def loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        if model.training:
            calls[0] += 1
            if calls[0] == step:
                n.request_stop()
        return original(model, batch)

    object.__setattr__(n.experiment, "loss", loss)
