"""An experiment module registered with --experiment-module in the tests: a regression that
never improves (its learning rate is zero), so early stopping ends it at epoch 2."""

from __future__ import annotations

from nitro_core import Best, Checkpointer, EarlyStopping, Last
from nitro_core.examples import Regression


class StopsEarly(Regression):
    """Regression with lr=0 and EarlyStopping(patience=1): it stops after epoch 2."""

    samples: int = 64
    lr: float = 0.0

    def early_stopping(self):
        return EarlyStopping(patience=1)

    def checkpointer(self):
        return Checkpointer(keep=(Best(3), Last(5)))
