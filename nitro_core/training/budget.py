"""A run's budget: ``max_steps`` (optimizer steps of the run, counted from its start) and
``time_limit`` (seconds of this ``train()`` call). At each checkpoint point the budget says
whether the next point would land past it; if so the run stops here, at the last point
within the budget, with ``stop_reason="budget"`` on the record it writes, so
``resume="auto"`` continues it exactly.

``max_steps`` is the run's total, across resumes, as ``max_epochs`` is: a resume (a re-sent
call, a group's or a Slurm job's) with the same budget trains nothing past it. Where the
train split has a length, the next point's step is known exactly (:func:`next_point`: the
next multiple of ``every_steps`` inside the epoch, else the epoch's end), so the run takes
the last point inside the budget, and a resume whose next point lies past it is refused
before a step. A split without a length falls back to an estimate: the next point lies at
most the largest gap between two points seen so far after this one. The time budget is
always estimated that way: the next point's time lies at most the largest gap seen (from
the start of ``train()`` for the first) after this one, plus a quarter of it for the write
and the scheduler's slack. Decide only: the handle agrees on the answer across ranks (their
clocks differ) and stops.
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

    def spent(self, step: int, next_step: int | None = None) -> bool:
        """At the point of ``step``: whether the next point (at ``next_step`` when known)
        would pass the budget."""
        now = self.clock()
        last_step, last_time = self._last
        self._gap = (max(self._gap[0], step - last_step), max(self._gap[1], now - last_time))
        self._last = (step, now)
        ahead = next_step if next_step is not None else step + self._gap[0]
        if self.max_steps is not None and ahead > self.max_steps:
            return True
        if self.time_limit is not None:
            return (now - self._began) + SLACK * self._gap[1] > self.time_limit
        return False

    def left(self, step: int) -> bool:
        """Whether a run at ``step`` has any step of its budget left."""
        return self.max_steps is None or step < self.max_steps


def next_point(
    step: int, done: int, total: int | None, accumulate: int, every: int | None
) -> int | None:
    """The step of the first checkpoint point after ``step``, ``done`` batches into an epoch
    of ``total`` (``done == total``: at its end, so the next epoch's), with ``accumulate``
    batches per optimizer step and a mid-epoch point every ``every`` steps; None when the
    split has no length. A mid-epoch point never falls on the epoch's last step: the end is
    the point there (as the loop decides)."""
    if total is None or total <= 0:
        return None
    if done >= total:
        done = 0
    end = step + -(-(total - done) // accumulate)  # the short last window steps too
    if every:
        mid = (step // every + 1) * every
        if mid < end:
            return mid
    return end
