"""Stopping and plateau schedules, both watching the experiment's monitor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from nitro_core.errors import ConfigError


@dataclass(frozen=True)
class EarlyStopping:
    """Stop when the monitor has not improved by more than ``min_delta`` for ``patience``
    validated checkpoint points (epoch ends, and with ``Checkpointer(every_steps=N)`` the
    points inside epochs too)."""

    patience: int = 5
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        if (
            isinstance(self.patience, bool)
            or not isinstance(self.patience, int)
            or self.patience < 1
        ):
            raise ConfigError(
                f"EarlyStopping(patience={self.patience!r}): write a positive integer, e.g. patience=5."
            )
        if not _number(self.min_delta) or not self.min_delta >= 0:
            raise ConfigError(f"EarlyStopping(min_delta={self.min_delta!r}): write a number >= 0.")


class EarlyStopper:
    """Live state of an :class:`EarlyStopping` rule."""

    def __init__(self, rule: EarlyStopping, mode: Literal["min", "max"]) -> None:
        self.rule, self.mode = rule, mode
        self.best: float | None = None
        self.wait = 0

    def update(self, value: float) -> bool:
        """Record one validated value; True when training should stop."""
        sign = 1.0 if self.mode == "min" else -1.0
        if self.best is None or sign * (self.best - value) > self.rule.min_delta:
            self.best, self.wait = value, 0
            return False
        self.wait += 1
        return self.wait >= self.rule.patience

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.wait = state["best"], state["wait"]


@dataclass(frozen=True)
class Plateau:
    """Multiply the learning rate by ``factor`` when the monitor has not improved for
    ``patience`` checkpoint points (epochs, or with ``every_steps`` every point; torch's
    ``ReduceLROnPlateau``, in the monitor's mode)."""

    factor: float = 0.1
    patience: int = 5
    threshold: float = 1e-4
    cooldown: int = 0
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if not _number(self.factor) or not 0.0 < self.factor < 1.0:
            raise ConfigError(
                f"Plateau(factor={self.factor!r}): factor must lie in (0, 1); write factor=0.1."
            )
        for field in ("patience", "cooldown"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"Plateau({field}={value!r}): write a non-negative integer, e.g. {field}=5."
                )

    def build(self, optimizer: torch.optim.Optimizer, mode: Literal["min", "max"]) -> Any:
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer,
            mode=mode,
            factor=self.factor,
            patience=self.patience,
            threshold=self.threshold,
            cooldown=self.cooldown,
            min_lr=self.min_lr,
        )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
