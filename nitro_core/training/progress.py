"""Progress of a run while it trains: a one-line bar on stderr (only on an interactive
terminal) and, for a listener such as the job worker, throttled snapshots of the epoch in
progress (batch, a recent loss, ETAs).

The loop calls ``update`` after every optimizer step, so the per-step cost is one clock
read and a comparison. Only when a snapshot is due (every ``LISTEN_S`` seconds of wall
time, never per step) is the running loss read from the device, which is then the one
host sync. A snapshot is also sent at an epoch's end when one was sent during that epoch,
so that a listener never keeps a half-done epoch that has in fact ended.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

LISTEN_S = 2.0  # seconds of wall time between two snapshots for the listener
DRAW_S = 0.1  # seconds between two redraws of the terminal bar


@dataclass(frozen=True)
class Snapshot:
    """Where the epoch in progress stands.

    ``loss`` is the mean training loss over the steps since the previous snapshot of the
    same epoch (of the whole epoch so far for its first); ``epoch_eta_s`` the seconds left
    in this epoch's training steps; ``eta_s`` the seconds left to ``max_epochs``, counting
    each remaining epoch as long as the last whole one (validation and checkpoint included).
    Either ETA is None until it can be estimated (the batch count unknown, one step done)."""

    epoch: int
    max_epochs: int
    step: int | None
    batch: int
    batches: int | None
    loss: float | None
    epoch_eta_s: float | None
    eta_s: float | None
    at: float  # time.time() when taken


Listener = Callable[[Snapshot], None]


class Progress:
    """The bar is silent when ``stream`` is not a TTY; ``listener`` (when set) receives a
    :class:`Snapshot` every ``every_s`` seconds while an epoch trains."""

    def __init__(
        self,
        stream: TextIO | None = None,
        listener: Listener | None = None,
        every_s: float = LISTEN_S,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.listener = listener
        self.every_s = every_s
        self._next_draw = 0.0
        self._next_note = 0.0
        self._epoch = -1  # the epoch the timings below belong to
        self._first_t = 0.0  # when its first step ended
        self._first_done = 0
        self._mark: tuple[int, float] = (0, 0.0)  # (batches, loss sum) at the last snapshot
        self._epoch_started: float | None = None  # end of the previous epoch, when seen
        self._epoch_s: float | None = None  # the last whole epoch, validation included
        self._last: Snapshot | None = None
        self._noted_in_epoch = False

    def update(
        self,
        epoch: int,
        max_epochs: int,
        done: int,
        total: int | None,
        step: int | None = None,
        loss_sum: Any = None,
    ) -> None:
        """After a step: ``done`` batches of ``total`` in ``epoch``; ``loss_sum`` is the
        epoch's running sum of losses (a tensor, read only when a snapshot is due)."""
        now = time.monotonic()
        if epoch != self._epoch:
            self._start_epoch(epoch, done, now)
        if self.listener is not None and now >= self._next_note:
            self._next_note = now + self.every_s
            self._note(epoch, max_epochs, done, total, step, loss_sum, now)
        if self.enabled and (now >= self._next_draw or done == total):
            self._next_draw = now + DRAW_S
            self._draw(epoch, max_epochs, done, total)

    def epoch_end(self, summary: str) -> None:
        """The epoch was validated, logged and checkpointed: time it, close its snapshot."""
        now = time.monotonic()
        if self._epoch_started is not None:
            self._epoch_s = now - self._epoch_started
        elif self._epoch >= 0:  # the first epoch seen: timed from its first step
            self._epoch_s = now - self._first_t
        self._epoch_started = now
        last = self._last
        if self.listener is not None and self._noted_in_epoch and last is not None:
            self._noted_in_epoch = False
            left = max(0, last.max_epochs - last.epoch)
            eta = None if self._epoch_s is None else round(left * self._epoch_s, 1)
            done = last.batches if last.batches is not None else last.batch
            self._send(
                Snapshot(
                    last.epoch,
                    last.max_epochs,
                    last.step,
                    done,
                    last.batches,
                    last.loss,
                    0.0,
                    eta,
                    time.time(),
                )  # fmt: skip
            )
        if self.enabled:
            self.stream.write(f"\r{summary:<60}\n")
            self.stream.flush()

    # -- internals ------------------------------------------------------------------------
    def _start_epoch(self, epoch: int, done: int, now: float) -> None:
        self._epoch = epoch
        self._first_t, self._first_done = now, done
        self._mark = (0, 0.0)
        self._noted_in_epoch = False

    def _per_batch(self, done: int, now: float) -> float:
        """Seconds per batch in this epoch so far (0 until two steps were timed)."""
        steps = done - self._first_done
        return (now - self._first_t) / steps if steps > 0 else 0.0

    def _note(
        self, epoch: int, max_epochs: int, done: int, total: int | None, step: int | None,
        loss_sum: Any, now: float,
    ) -> None:  # fmt: skip
        loss = None
        if loss_sum is not None:
            total_loss = float(loss_sum)  # the one host sync, every every_s seconds
            seen, before = self._mark
            if done > seen:
                loss = (total_loss - before) / (done - seen)
            self._mark = (done, total_loss)
        per_batch = self._per_batch(done, now)
        epoch_eta = eta = None
        if total is not None and per_batch > 0:
            epoch_eta = per_batch * max(0, total - done)
            whole = self._epoch_s if self._epoch_s is not None else per_batch * total
            eta = epoch_eta + max(0, max_epochs - epoch) * whole
        self._noted_in_epoch = True
        self._send(
            Snapshot(
                epoch, max_epochs, step, done, total, loss,
                None if epoch_eta is None else round(epoch_eta, 1),
                None if eta is None else round(eta, 1), time.time(),
            )
        )  # fmt: skip

    def _send(self, snapshot: Snapshot) -> None:
        self._last = snapshot
        assert self.listener is not None
        self.listener(snapshot)

    def _draw(self, epoch: int, max_epochs: int, done: int, total: int | None) -> None:
        frac = done / total if total else 0.0
        bar = "#" * int(20 * frac)
        of = f"/{total}" if total else ""
        self.stream.write(f"\repoch {epoch}/{max_epochs} [{bar:<20}] {done}{of}")
        self.stream.flush()
