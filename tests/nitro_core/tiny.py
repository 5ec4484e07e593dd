"""Tiny experiments for tests: a linear model on a handful of rows, each variant a hook away."""

from __future__ import annotations

import torch
from pydantic import PrivateAttr

from nitro_core import (
    Best,
    Checkpointer,
    Experiment,
    Host,
    Last,
    TensorBatches,
)
from nitro_core.sources.grammar import parse_keep


class Tiny(Experiment):
    """y = 2x on 32 rows; ranked by validation loss."""

    lr: float = 0.05
    width: int = 4
    max_epochs: Host[int] = 3

    def build_data(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(32, self.width, generator=g)
        y = 2 * x.sum(1, keepdim=True)
        return {
            "train": TensorBatches({"x": x, "y": y}, 8, shuffle=True),
            "val": TensorBatches({"x": x[:16], "y": y[:16]}, 8),
        }

    def build_model(self):
        return torch.nn.Linear(self.width, 1)

    def loss(self, model, batch):
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])


class KeepLast(Tiny):
    def checkpointer(self):
        return Checkpointer(keep=Last(2))


class NoVal(Tiny):
    def build_data(self):
        return {"train": super().build_data()["train"]}

    def checkpointer(self):
        return Checkpointer(keep=Last(1))


class WithAcc(Tiny):
    """Custom metrics: 'acc' is the fraction of rows within 1.0 of the target."""

    def metrics(self, model, batch):
        close = ((model(batch["x"]) - batch["y"]).abs() < 1.0).sum()
        return {"acc": (close, len(batch["y"]))}

    def monitor(self):
        return ("acc", "max")


class BestOnly(Tiny):
    def checkpointer(self):
        return Checkpointer(keep=Best(2))


class Scripted(Tiny):
    """Validation reports ``scores[epoch - 1]`` as 'score' (min), so a test decides which
    epochs Best keeps; ``keep`` is the checkpointer's keep, as its text."""

    scores: tuple[float, ...] = (5.0, 1.0, 4.0, 2.0, 3.0, 6.0)
    keep: str = "(Best(2), Last(1))"
    max_epochs: Host[int] = 6
    _calls: list[int] = PrivateAttr(default_factory=list)

    def finalize_metrics(self, totals, split):
        self._calls.append(1)
        return {"score": self.scores[(len(self._calls) - 1) % len(self.scores)]}

    def metrics(self, model, batch):
        return {"n": (1, 1)}

    def monitor(self):
        return ("score", "min")

    def checkpointer(self):
        return Checkpointer(keep=parse_keep(self.keep))
