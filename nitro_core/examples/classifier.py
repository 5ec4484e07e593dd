"""``Classifier``: Gaussian blobs, an MLP with BatchNorm (layer state) and dropout, an
``acc`` metric that ranks checkpoints, and an EMA of the weights."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from nitro_core.experiment import Experiment, Host
from nitro_core.policy.selectors import Best, Checkpointer, Last
from nitro_core.state.ema import EMA
from nitro_core.training.data import TensorBatches


class Classifier(Experiment):
    """Classify points drawn around random centers; ranked by accuracy (max), with an EMA;
    keeps the best three and the latest three epochs."""

    # bounded, so a call cannot ask for 10**12 samples (an MCP client sets these fields)
    features: int = Field(16, ge=1, le=256)
    classes: int = Field(4, ge=2, le=1000)
    hidden: int = Field(64, ge=1, le=4096)
    dropout: float = Field(0.1, ge=0, lt=1)
    samples: int = Field(1024, ge=8, le=100_000)
    batch_size: int = Field(64, ge=2, le=100_000)  # BatchNorm needs two samples a batch
    lr: float = Field(3e-3, gt=0, le=10)
    ema_decay: Host[float] = Field(0.9, gt=0, lt=1)
    max_epochs: Host[int] = Field(6, le=10_000)  # at least 1: Experiment checks it

    def build_data(self) -> dict[str, TensorBatches]:
        g = torch.Generator().manual_seed(4321)
        centers = 0.6 * torch.randn(self.classes, self.features, generator=g)
        y = torch.randint(0, self.classes, (self.samples,), generator=g)
        x = centers[y] + 1.0 * torch.randn(self.samples, self.features, generator=g)
        cut, end = self.samples * 3 // 4, self.samples * 7 // 8
        return {
            "train": TensorBatches({"x": x[:cut], "y": y[:cut]}, self.batch_size, shuffle=True),
            "val": TensorBatches({"x": x[cut:end], "y": y[cut:end]}, self.batch_size),
            "test": TensorBatches({"x": x[end:], "y": y[end:]}, self.batch_size),
        }

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Linear(self.features, self.hidden),
            torch.nn.BatchNorm1d(self.hidden),
            torch.nn.ReLU(),
            torch.nn.Dropout(self.dropout),
            torch.nn.Linear(self.hidden, self.classes),
        )

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])

    def metrics(
        self, model: torch.nn.Module, batch: dict[str, torch.Tensor]
    ) -> dict[str, tuple[torch.Tensor, int]]:
        correct = (model(batch["x"]).argmax(dim=1) == batch["y"]).sum()
        return {"acc": (correct, len(batch["y"]))}

    def eval_loss(self) -> bool:
        return True

    def monitor(self) -> tuple[str, Literal["min", "max"]]:
        return ("acc", "max")

    def ema(self) -> EMA:
        return EMA(decay=self.ema_decay)

    def checkpointer(self) -> Checkpointer:
        # the best three, and a window of the latest three to average
        return Checkpointer(keep=(Best(3), Last(3)))
