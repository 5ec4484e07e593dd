"""A user's experiment as a type checker sees it: Host fields are plain ints to mypy."""

from __future__ import annotations

import torch

from nitro_core import Checkpointer, Experiment, Host, Last, Nitro, TensorBatches


class MyExp(Experiment):
    hidden: int = 16
    max_epochs: Host[int] = 5

    def build_data(self) -> dict[str, TensorBatches]:
        x = torch.randn(64, 4)
        return {"train": TensorBatches({"x": x, "y": x.sum(1, keepdim=True)}, 16)}

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Linear(4, 1)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])

    def checkpointer(self) -> Checkpointer:
        return Checkpointer(keep=Last(1))


epochs: int = MyExp(max_epochs=3).max_epochs + 1
n: Nitro = Nitro(MyExp(), run_dir="runs/typed")
