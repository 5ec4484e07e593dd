"""An experiment module registered with --experiment-module in the tests: one of its
reported (unwatched) metrics is NaN."""

from __future__ import annotations

import torch

from nitro_core import Checkpointer, Last
from nitro_core.examples import Regression


class NanMetric(Regression):
    """Regression reporting a NaN 'spread' beside its loss."""

    samples: int = 128

    def metrics(self, model, batch):
        return {"spread": (float("nan"), 1.0)}

    def eval_loss(self):
        return True

    def checkpointer(self):
        return Checkpointer(keep=Last(1))

    def build_model(self):
        return torch.nn.Linear(self.features, 1)
