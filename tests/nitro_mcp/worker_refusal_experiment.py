"""An experiment module registered with --experiment-module in the tests: its evaluation
refuses with a library refusal whose parts name an argument, in the worker alone (nothing
the call's checks read says it will)."""

from __future__ import annotations

from nitro_core.errors import ConfigError, arg
from nitro_core.examples import Regression


class RefusesToEvaluate(Regression):
    """Regression whose validation metrics refuse, naming load_ema as a Python caller writes it."""

    def metrics(self, model, batch):
        raise ConfigError(
            arg("load_ema", True),
            ", but this experiment refuses when its worker evaluates. Drop load_ema.",
        )

    def eval_loss(self):
        return True  # ranked by the loss, as Regression is
