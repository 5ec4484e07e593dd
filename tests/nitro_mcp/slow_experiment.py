"""An experiment module registered with --experiment-module in the tests: every training
step sleeps, so an epoch lasts long enough to show progress inside it, and a training job
runs as long as a test needs while leaving the CPU to the rest."""

from __future__ import annotations

import time

from pydantic import Field

from nitro_core.examples import Regression


class SlowSteps(Regression):
    """Regression whose training steps each take step_s seconds (evaluation is not slowed)."""

    step_s: float = Field(0.1, ge=0, le=5)
    samples: int = 512
    batch_size: int = 16  # 384 training rows: 24 batches an epoch

    def loss(self, model, batch):
        if model.training:
            time.sleep(self.step_s)
        return super().loss(model, batch)
