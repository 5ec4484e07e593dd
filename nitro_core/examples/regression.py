"""``Regression``: a small MLP fitting a fixed random linear map plus noise. It defines no
metrics hook, so checkpoints are ranked by validation loss."""

from __future__ import annotations

import torch
from pydantic import Field

from nitro_core.experiment import Experiment, Host
from nitro_core.training.data import TensorBatches


class Regression(Experiment):
    """Fit y = x @ W + noise with a two-layer MLP; ranked by validation loss (min)."""

    # bounded, so a call cannot ask for 10**12 samples (an MCP client sets these fields)
    features: int = Field(8, ge=1, le=256)
    hidden: int = Field(32, ge=1, le=4096)
    samples: int = Field(512, ge=8, le=100_000)
    batch_size: int = Field(64, ge=1, le=100_000)
    lr: float = Field(1e-2, gt=0, le=10)
    max_epochs: Host[int] = Field(5, le=10_000)  # at least 1: Experiment checks it

    def build_data(self) -> dict[str, TensorBatches]:
        g = torch.Generator().manual_seed(1234)  # the data set is fixed, whatever the seed
        w = torch.randn(self.features, 1, generator=g)
        x = torch.randn(self.samples, self.features, generator=g)
        y = x @ w + 0.1 * torch.randn(self.samples, 1, generator=g)
        cut = self.samples * 3 // 4
        return {
            "train": TensorBatches({"x": x[:cut], "y": y[:cut]}, self.batch_size, shuffle=True),
            "val": TensorBatches({"x": x[cut:], "y": y[cut:]}, self.batch_size),
        }

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Linear(self.features, self.hidden),
            torch.nn.Tanh(),
            torch.nn.Linear(self.hidden, 1),
        )

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=self.lr)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
