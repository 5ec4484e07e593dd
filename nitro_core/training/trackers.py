"""What the loggers that send rows to an experiment tracker share (:class:`MLflowLogger`,
:class:`WandbLogger`): the JSONL log kept beside the tracker, the tracker's run ids in the
record, a resume that sends no step twice, and a tracker that is down costing the run one
bounded wait, never the run.

A tracker's history only grows: nothing sent can be taken back. Every row is sent when it
is logged (the tracker's charts are live), before its record is written, so a run stopped
between a row and its record has sent steps that the resume computes again. A resume asks
the tracker for the last step it holds and sends only the rows past it: the series has no
gap and no repeated step (the rows it keeps are the stopped run's, which a bitwise resume
computes the same, ``seconds`` aside).

A tracker is a side channel (:mod:`nitro_core.training.tracker_calls` bounds each call):

- at setup, a fresh run whose tracker does not answer is refused (``ConfigError`` naming
  where it was asked and what to change); a resume goes on without it, with a warning;
- during a run, a call that fails or has no answer in time leaves the tracker out for the
  rest of the handle, with one warning; training goes on;
- every row is in the JSONL log either way, and the record keeps the tracker's run ids: the
  first row a later handle sends also sends, from that log, every row the tracker missed.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from nitro_core.errors import ConfigError, NitroWarning
from nitro_core.store.metrics_log import JSONLLogger, log_path, read_log
from nitro_core.training import tracker_calls

_NUMERIC = (int, float)
T = TypeVar("T")


def scalars(row: dict[str, Any], prefix: str = "") -> list[tuple[str, float]]:
    """(tag, value) for every number of a row; nested dicts give ``key/name`` tags."""
    out: list[tuple[str, float]] = []
    for key, value in row.items():
        if key in ("run", "step") and not prefix:
            continue
        if isinstance(value, dict):
            out += scalars(value, f"{prefix}{key}/")
        elif isinstance(value, _NUMERIC) and not isinstance(value, bool):
            out.append((f"{prefix}{key}", float(value)))
    return out


def require(package: str, logger: str, extra: str, pin: str) -> None:
    """Refuse, at setup, a logger whose package is not installed (found, not imported)."""
    if importlib.util.find_spec(package) is None:
        raise ConfigError(
            f"{logger} needs the {package} package, which is not installed: pip install "
            f"'nitro[{extra}]' (or pip install '{pin}'). Or log with JSONLLogger() "
            "(logger='jsonl')."
        )


@dataclass(frozen=True)
class Unanswered:
    """Why a tracker cannot be used now: ``what`` follows the logger's class name in a
    sentence ("cannot reach ... at <uri>: connection refused"), ``fix`` says what to
    change."""

    what: str
    fix: str


class _Failed(Exception):
    """A tracker call failed or had no answer in time: ``doing`` it, for ``why``."""

    def __init__(self, doing: str, why: str) -> None:
        super().__init__(doing, why)
        self.doing, self.why = doing, why


class TrackerLogger:
    """The JSONL log, and rows sent to a tracker run that a resume continues.

    A subclass names its ``backend``, its ``tracker`` (for messages), the ``modules`` its
    calls import and the key of its run's id in ``ids`` (``id_key``), and implements
    :meth:`_check` (at setup: why the tracker cannot be used, None when it can),
    :meth:`_where`, :meth:`_start` (open or continue the tracker's run; returns its ids,
    kept in the record), :meth:`_held_step` (the last step the continued run holds, -1 for
    none), :meth:`_send` and :meth:`_finish`. Every call but :meth:`_check` and
    :meth:`_where` runs bounded (:func:`~nitro_core.training.tracker_calls.bounded`)."""

    backend = "tracker"
    tracker = "the tracker"
    id_key = "id"

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        self.params = dict(params or {})  # logged once, when the tracker's run is created
        self._jsonl = JSONLLogger()
        self.run_dir: Path | None = None
        self.run_id: str | None = None
        self.ids: dict[str, Any] | None = None  # the tracker's run, once known
        self._live = False  # the tracker's run is open in this process
        self._held = -1  # rows at or before this step are not sent
        self._step: int | None = None  # the step of the last row logged
        self._seconds = tracker_calls.DEFAULT_TIMEOUT_S  # the bound of one call
        self._out: str | None = None  # why the tracker is left out, once it is

    def open(self, run_dir: Path, run_id: str, state: dict[str, Any] | None) -> None:
        """Remember where to log, and check that the tracker answers; nothing is sent until
        the first row. ``state`` (a record's) names the tracker's run to continue: a resume
        whose tracker does not answer goes on without it (warned), a fresh run is refused."""
        resumed = state is not None
        state = state or {}
        self._jsonl.open(run_dir, run_id, state.get("jsonl") if state else None)
        self.run_dir, self.run_id = Path(run_dir), run_id
        self.ids = dict(state[self.backend]) if state.get(self.backend) else None
        self._step = state.get("step")
        self._seconds, self._out = tracker_calls.timeout(), None
        problem = self._check(self.ids)
        if problem is None:
            return
        if not resumed:
            raise ConfigError(
                f"{type(self).__name__} {problem.what}. {problem.fix}; or log with "
                "JSONLLogger() (logger='jsonl')."
            )
        self._leave_out(
            f"{type(self).__name__} {problem.what}. Run {run_id} resumes without "
            f"{self.tracker}; every row is in {self._log_path()}. {self._later()}",
            stacklevel=4,  # the Nitro(...) call
        )

    def log(self, row: dict[str, Any]) -> None:
        self._jsonl.log(row)
        step = int(row["step"])
        if self._out is None:
            try:
                self._track(row, step)
            except _Failed as failed:
                self._failed(step, failed)
        self._step = step

    def _load(self) -> None:
        """Import what the tracker's calls use, before its first call (a subclass's)."""

    def _track(self, row: dict[str, Any], step: int) -> None:
        """Send ``row``; the first row of this handle opens the tracker's run and sends the
        rows it missed first (the JSONL log's rows past the last step it holds)."""
        if not self._live:
            self._load()  # outside the bound: a heavy import is no tracker's silence
            continued = self.ids is not None
            self.ids = self._call("opening its run", self._start, self.ids)
            self._live = True
            self._held = self._call("reading its last step", self._held_step) if continued else -1
            for missed in self._missed(step):
                at = int(missed["step"])
                self._call(f"sending step {at}, which it missed", self._send, scalars(missed), at)
        if step > self._held:
            self._call("sending the row", self._send, scalars(row), step)

    def _missed(self, step: int) -> list[dict[str, Any]]:
        """The JSONL log's rows after the tracker's last step and before ``step``."""
        assert self.run_dir is not None and self.run_id is not None  # open() ran first
        rows = read_log(self.run_dir, self.run_id).rows
        return [r for r in rows if isinstance(r.get("step"), int) and self._held < r["step"] < step]

    def state(self) -> dict[str, Any]:
        return {"jsonl": self._jsonl.state(), "step": self._step, self.backend: self.ids}

    def close(self) -> None:
        self._jsonl.close()
        if self._live:
            self._live = False
            if self._out is None:
                try:
                    self._call("finishing its run", self._finish)
                except _Failed as failed:
                    self._failed(self._step, failed)

    # -- a tracker that does not answer ---------------------------------------------------
    def _call(self, doing: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` within the bound; :class:`_Failed` when it fails or times out."""
        try:
            return tracker_calls.bounded(lambda: fn(*args), self._seconds)
        except Exception as exc:  # any failure of a side channel leaves it out
            raise _Failed(doing, tracker_calls.reason(exc, self._seconds)) from exc

    def _failed(self, step: int | None, failed: _Failed) -> None:
        self._leave_out(
            f"{self.tracker} {self._where()} failed at step {step} ({failed.doing}: "
            f"{failed.why}). Run {self.run_id} goes on without it; every row is in "
            f"{self._log_path()}. {self._later()}",
            stacklevel=4,
        )

    def _leave_out(self, message: str, stacklevel: int) -> None:
        """Send nothing more from this handle; say so once."""
        self._out = message
        warnings.warn(message, NitroWarning, stacklevel=stacklevel)

    def _later(self) -> str:
        ran = f"continues its run {self.ids[self.id_key]} with" if self.ids else "sends it"
        return f"A resume once {self.tracker} answers again {ran} the rows it missed."

    def _log_path(self) -> Path:
        assert self.run_dir is not None and self.run_id is not None  # open() ran first
        return log_path(self.run_dir, self.run_id)

    # -- the tracker's part ---------------------------------------------------------------
    def _check(self, ids: dict[str, Any] | None) -> Unanswered | None:
        raise NotImplementedError

    def _where(self) -> str:
        raise NotImplementedError

    def _start(self, ids: dict[str, Any] | None) -> dict[str, Any]:
        raise NotImplementedError

    def _held_step(self) -> int:
        raise NotImplementedError

    def _send(self, values: list[tuple[str, float]], step: int) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError
