"""Progress of a run while it trains, on stderr and for a listener (the job worker).

- On an interactive terminal: a tqdm bar per epoch (batches done, rate, the epoch's ETA and
  the run's), replaced at the epoch's end by the epoch's summary line.
- Off a terminal (a log file, a pipe, a job's stderr): a plain line at most every
  ``PLAIN_S`` seconds inside an epoch and the summary line at each epoch's end, so that a
  long run is never minutes of silence. Both are tqdm's own formatting.
- For a listener: throttled :class:`Snapshot` s of the epoch in progress (batch, a recent
  loss, ETAs).

Only stderr is written, never stdout (the MCP stdio channel), and only by the process of
rank 0 (``RANK`` unset or 0): the other ranks of a distributed run stay quiet.

The loop calls ``update`` after every optimizer step, so the per-step cost is one clock
read and a comparison: the bar is redrawn every ``DRAW_S`` seconds, never per step. Only
when a snapshot is due (every ``LISTEN_S`` seconds of wall time) is the running loss read
from the device, which is then the one host sync. A snapshot is also sent at an epoch's end
when one was sent during that epoch, so that a listener never keeps a half-done epoch that
has in fact ended.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from tqdm import tqdm

LISTEN_S = 2.0  # seconds of wall time between two snapshots for the listener
DRAW_S = 0.1  # seconds between two redraws of the terminal bar
PLAIN_S = 30.0  # seconds between two plain lines inside an epoch, off a terminal
STOPPING = "stopping after this epoch; Ctrl+C again to interrupt"  # the first Ctrl+C

_PLAIN = "{desc}: {n_fmt}/{total_fmt} batches ({percentage:.0f}%) [{elapsed}<{remaining}, {rate_fmt}{postfix}]"  # fmt: skip
_PLAIN_OPEN = "{desc}: {n_fmt} batches [{elapsed}, {rate_fmt}{postfix}]"  # the batch count unknown


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


class _Bar(tqdm):  # type: ignore[misc]  # tqdm is untyped
    """tqdm without its monitor thread: the bar is redrawn by ``update`` alone."""

    monitor_interval = 0


def _is_tty(stream: TextIO | None) -> bool:
    return stream is not None and bool(getattr(stream, "isatty", lambda: False)())


def _columns(stream: TextIO) -> int | None:
    """The terminal's width, or None where it reports none (a pseudo terminal of size 0x0,
    on which tqdm's own measure would hide the bar)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return None
    return columns if columns > 0 else None


def _shows() -> bool:
    """Whether this process writes progress: rank 0 of a distributed run, or the one process."""
    return os.environ.get("RANK", "0") == "0"


def notice(text: str, stream: TextIO | None = None) -> None:
    """Write ``text`` on a line of its own to ``stream`` (stderr): on a terminal it starts
    a new line, leaving the bar's line (and the ``^C`` the terminal echoed) as they are."""
    stream = stream if stream is not None else sys.stderr
    if stream is None or not _shows():  # no stderr at all (pythonw), or another rank's
        return
    stream.write(("\n" if _is_tty(stream) else "") + text + "\n")
    stream.flush()


class Progress:
    """Writes to ``stream`` (stderr by default): a bar on a terminal, a plain line every
    ``plain_every_s`` seconds inside an epoch elsewhere, each epoch's summary on both.
    ``listener`` (when set) receives a :class:`Snapshot` every ``every_s`` seconds while an
    epoch trains."""

    def __init__(
        self,
        stream: TextIO | None = None,
        listener: Listener | None = None,
        every_s: float = LISTEN_S,
        plain_every_s: float = PLAIN_S,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.shows = self.stream is not None and _shows()
        self.tty = _is_tty(self.stream)
        self.listener = listener
        self.every_s = every_s
        self.plain_every_s = plain_every_s
        self._bar: Any = None  # the terminal's bar of the epoch in progress
        self._next_show = 0.0
        self._next_note = 0.0
        self._epoch = -1  # the epoch the timings below belong to
        self._max_epochs = 0
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
            self._start_epoch(epoch, max_epochs, done, now)
        if self.listener is not None and now >= self._next_note:
            self._next_note = now + self.every_s
            self._note(epoch, max_epochs, done, total, step, loss_sum, now)
        if self.shows and (now >= self._next_show or (self.tty and done == total)):
            self._next_show = now + (DRAW_S if self.tty else self.plain_every_s)
            if self.tty:
                self._draw(epoch, max_epochs, done, total, now)
            else:
                self._line(epoch, max_epochs, done, total, now)

    def epoch_end(self, summary: str) -> None:
        """The epoch was validated, logged and checkpointed: time it, close its snapshot,
        write its summary (with its duration and the run's ETA) in place of the bar."""
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
        if self._bar is not None:
            self._bar.close()  # leave=False: its line is cleared for the summary
            self._bar = None
        if self.shows:
            self.stream.write(summary + self._timing() + "\n")
            self.stream.flush()

    # -- internals ------------------------------------------------------------------------
    def _start_epoch(self, epoch: int, max_epochs: int, done: int, now: float) -> None:
        if self._bar is not None:  # an epoch that ended without epoch_end (an exception)
            self._bar.close()
            self._bar = None
        self._epoch, self._max_epochs = epoch, max_epochs
        self._first_t, self._first_done = now, done
        self._mark = (0, 0.0)
        self._noted_in_epoch = False
        self._next_show = now if self.tty else now + self.plain_every_s

    def _per_batch(self, done: int, now: float) -> float:
        """Seconds per batch in this epoch so far (0 until two steps were timed)."""
        steps = done - self._first_done
        return (now - self._first_t) / steps if steps > 0 else 0.0

    def _etas(
        self, epoch: int, max_epochs: int, done: int, total: int | None, now: float
    ) -> tuple[float | None, float | None]:
        """Seconds left in this epoch's steps and in the run, when they can be estimated."""
        per_batch = self._per_batch(done, now)
        if total is None or per_batch <= 0:
            return None, None
        epoch_eta = per_batch * max(0, total - done)
        whole = self._epoch_s if self._epoch_s is not None else per_batch * total
        return epoch_eta, epoch_eta + max(0, max_epochs - epoch) * whole

    def _run_eta(self, epoch: int, max_epochs: int, eta: float | None) -> str | None:
        """The run's ETA as tqdm writes a duration, when later epochs remain."""
        if eta is None or epoch >= max_epochs:
            return None
        return f"run ETA {tqdm.format_interval(eta)}"

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
        epoch_eta, eta = self._etas(epoch, max_epochs, done, total, now)
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

    def _draw(self, epoch: int, max_epochs: int, done: int, total: int | None, now: float) -> None:
        """The terminal's bar, opened at the epoch's first draw, moved to ``done``."""
        bar = self._bar
        if bar is None:
            columns = _columns(self.stream)  # followed as the terminal resizes, when it has any
            bar = self._bar = _Bar(
                total=total, initial=self._first_done, desc=f"epoch {epoch}/{max_epochs}",
                unit="batch", file=self.stream, leave=False,
                dynamic_ncols=columns is not None, ncols=columns or 80,
                mininterval=0, miniters=1,  # drawn when update() calls: every DRAW_S
            )  # fmt: skip
        postfix = self._run_eta(
            epoch, max_epochs, self._etas(epoch, max_epochs, done, total, now)[1]
        )
        if postfix is not None:
            bar.set_postfix_str(postfix, refresh=False)
        bar.update(max(0, done - bar.n))

    def _line(self, epoch: int, max_epochs: int, done: int, total: int | None, now: float) -> None:
        """A plain progress line, for a log rather than a terminal."""
        eta = self._etas(epoch, max_epochs, done, total, now)[1]
        text = tqdm.format_meter(
            done, total, now - self._first_t, prefix=f"epoch {epoch}/{max_epochs}",
            unit="batch", initial=self._first_done, postfix=self._run_eta(epoch, max_epochs, eta),
            bar_format=_PLAIN if total else _PLAIN_OPEN,
        )  # fmt: skip
        self.stream.write(text + "\n")
        self.stream.flush()

    def _timing(self) -> str:
        """`` (12.3 s, run ETA 01:23)`` after an epoch's summary: how long it took, and the
        run's ETA counting each remaining epoch as long."""
        if self._epoch_s is None:
            return ""
        left = self._max_epochs - self._epoch
        text = f"{self._epoch_s:.1f} s"
        if left > 0:
            text += f", run ETA {tqdm.format_interval(left * self._epoch_s)}"
        return f" ({text})"
