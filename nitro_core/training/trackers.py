"""What the loggers that send rows to an experiment tracker share (:class:`MLflowLogger`,
:class:`WandbLogger`): the JSONL log kept beside the tracker, the tracker's run ids in the
record, and a resume that sends no step twice.

A tracker's history only grows: nothing sent can be taken back. Every row is sent when it
is logged (the tracker's charts are live), before its record is written, so a run stopped
between a row and its record has sent steps that the resume computes again. A resume asks
the tracker for the last step it holds and sends only the rows past it: the series has no
gap and no repeated step (the rows it keeps are the stopped run's, which a bitwise resume
computes the same, ``seconds`` aside).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from nitro_core.errors import ConfigError
from nitro_core.store.metrics_log import JSONLLogger

_NUMERIC = (int, float)


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


class TrackerLogger:
    """The JSONL log, and rows sent to a tracker run that a resume continues.

    A subclass names its ``backend`` and implements :meth:`_start` (open or continue the
    tracker's run; returns its ids, kept in the record), :meth:`_held` (the last step the
    continued run holds, -1 for none), :meth:`_send` and :meth:`_finish`."""

    backend = "tracker"

    def __init__(self, params: dict[str, Any] | None = None) -> None:
        self.params = dict(params or {})  # logged once, when the tracker's run is created
        self._jsonl = JSONLLogger()
        self.run_dir: Path | None = None
        self.run_id: str | None = None
        self.ids: dict[str, Any] | None = None  # the tracker's run, once known
        self._live = False  # the tracker's run is open in this process
        self._held = -1  # rows at or before this step are not sent
        self._step: int | None = None  # the step of the last row logged

    def open(self, run_dir: Path, run_id: str, state: dict[str, Any] | None) -> None:
        """Remember where to log; nothing is sent until the first row. ``state`` (a
        record's) names the tracker's run to continue."""
        state = state or {}
        self._jsonl.open(run_dir, run_id, state.get("jsonl") if state else None)
        self.run_dir, self.run_id = Path(run_dir), run_id
        self.ids = dict(state[self.backend]) if state.get(self.backend) else None
        self._step = state.get("step")

    def log(self, row: dict[str, Any]) -> None:
        self._jsonl.log(row)
        step = int(row["step"])
        if not self._live:
            continued = self.ids is not None
            self.ids = self._start(self.ids)
            self._live = True
            self._held = self._held_step() if continued else -1
        if step > self._held:
            self._send(scalars(row), step)
        self._step = step

    def state(self) -> dict[str, Any]:
        return {"jsonl": self._jsonl.state(), "step": self._step, self.backend: self.ids}

    def close(self) -> None:
        self._jsonl.close()
        if self._live:
            self._live = False
            self._finish()

    # -- the tracker's part ---------------------------------------------------------------
    def _start(self, ids: dict[str, Any] | None) -> dict[str, Any]:
        raise NotImplementedError

    def _held_step(self) -> int:
        raise NotImplementedError

    def _send(self, values: list[tuple[str, float]], step: int) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError
