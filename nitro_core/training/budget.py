"""A run's budget: ``max_steps`` (optimizer steps of the run, counted from its start) and
``time_limit`` (seconds of this ``train()`` call). At each checkpoint point the budget says
whether the next point would land past it; if so the run stops here, at the last point
within the budget, with ``stop_reason="budget"`` on the record it writes, so
``resume="auto"`` continues it exactly.

The next point is estimated from the run's own points: its step and its time lie at most
the largest gap between two points seen so far (from the start of ``train()`` for the
first) after this one, and the time margin adds a quarter of that gap for the write and the
scheduler's slack. Decide only: the handle agrees on the answer across ranks (their clocks
differ) and stops.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nitro_core.errors import ConfigError

SLACK = 1.25  # the time margin: this many of the largest gap between two points


def check_budget(max_steps: object, time_limit: object) -> None:
    """Refuse a budget that is not a positive count or number of seconds."""
    if max_steps is not None and (
        isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1
    ):
        raise ConfigError(
            f"Nitro(max_steps={max_steps!r}): write a positive number of optimizer steps, "
            "e.g. max_steps=1000, or None for no step budget."
        )
    if time_limit is not None and (
        isinstance(time_limit, bool)
        or not isinstance(time_limit, int | float)
        or not math.isfinite(time_limit)
        or time_limit <= 0
    ):
        raise ConfigError(
            f"Nitro(time_limit={time_limit!r}): write a positive number of seconds, e.g. "
            "time_limit=3600, or None for no time budget."
        )


@dataclass
class Budget:
    """The budget of one ``train()`` call; ``start`` it, then ask ``spent`` at each point."""

    max_steps: int | None = None
    time_limit: float | None = None
    clock: Callable[[], float] = time.monotonic
    _began: float = field(default=0.0, init=False)
    _last: tuple[int, float] = field(default=(0, 0.0), init=False)  # the last point's step, time
    _gap: tuple[int, float] = field(default=(0, 0.0), init=False)  # the largest gaps seen

    @property
    def active(self) -> bool:
        return self.max_steps is not None or self.time_limit is not None

    def header(self) -> dict[str, float | int | None] | None:
        """What a record says of the budget it was written under (None: no budget)."""
        if not self.active:
            return None
        return {"max_steps": self.max_steps, "time_limit": self.time_limit}

    def start(self, step: int) -> None:
        """``train()`` begins at ``step``: the time limit counts from now."""
        self._began = self.clock()
        self._last = (step, self._began)
        self._gap = (0, 0.0)

    def spent(self, step: int) -> bool:
        """At the point of ``step``: whether the next point would pass the budget."""
        now = self.clock()
        last_step, last_time = self._last
        self._gap = (max(self._gap[0], step - last_step), max(self._gap[1], now - last_time))
        self._last = (step, now)
        if self.max_steps is not None and step + self._gap[0] > self.max_steps:
            return True
        if self.time_limit is not None:
            return (now - self._began) + SLACK * self._gap[1] > self.time_limit
        return False

    def left(self, step: int) -> bool:
        """Whether a run at ``step`` has any step of its budget left."""
        return self.max_steps is None or step < self.max_steps
