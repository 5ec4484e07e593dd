"""An experiment module registered with --experiment-module in the tests: its training loss
turns NaN in the second epoch, after the first epoch's record was written."""

from __future__ import annotations

from pydantic import PrivateAttr

from nitro_core.examples import Regression


class Diverging(Regression):
    """Regression whose training loss is NaN from its fourth training step on (epoch 2)."""

    samples: int = 256  # 192 training rows: three steps an epoch
    _steps: int = PrivateAttr(0)

    def loss(self, model, batch):
        loss = super().loss(model, batch)
        if model.training:
            self._steps += 1
            if self._steps > 3:
                return loss * float("nan")
        return loss
