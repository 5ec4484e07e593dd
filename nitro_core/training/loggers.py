"""Metrics loggers. The default writes one JSON object per line to
``<run_dir>/logs/<run_id>.jsonl``; its state (the byte offset reached) is stored in every
record, so a resume truncates lines written after the record and the log reads as if the
run had never stopped."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from nitro_core.store.safeio import confined_dir, open_nofollow


class Logger(Protocol):
    backend: str

    def open(self, run_dir: Path, run_id: str, state: dict[str, Any] | None) -> None: ...
    def log(self, row: dict[str, Any]) -> None: ...
    def state(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


class JSONLLogger:
    """One JSON line per validated epoch."""

    backend = "jsonl"

    def __init__(self) -> None:
        self.path: Path | None = None
        self.run_dir: Path | None = None
        self._f: Any = None
        self._offset: int | None = None

    def open(self, run_dir: Path, run_id: str, state: dict[str, Any] | None) -> None:
        """Remember where to log. Nothing is touched here: the file is created by the first
        row (a handle that only evaluates leaves no empty log), and a resume truncates what
        followed its record then, once training holds the run."""
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "logs" / f"{run_id}.jsonl"
        self._offset = None if state is None else state.get("offset")

    def _file(self) -> Any:
        """The log, opened for appending; neither ``logs/`` nor the file is followed through
        a link out of the run directory (:class:`~nitro_core.errors.UnsafePath`)."""
        if self._f is None:
            assert self.run_dir is not None and self.path is not None  # open() ran first
            confined_dir(self.run_dir, self.path.parent)
            fd = open_nofollow(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            self._f = os.fdopen(fd, "ab")
            if self._offset is not None:
                self._f.truncate(min(int(self._offset), os.fstat(fd).st_size))
                self._f.seek(0, os.SEEK_END)
                self._offset = None  # truncate once; a later reopen appends
        return self._f

    def log(self, row: dict[str, Any]) -> None:
        self._file().write(json.dumps(row, allow_nan=True).encode() + b"\n")
        self._f.flush()

    def state(self) -> dict[str, Any]:
        return {
            "file": self.path.name if self.path else None,
            "offset": self._file().tell() if self.path else 0,
        }

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class NullLogger:
    """Logs nothing."""

    backend = "null"

    def open(self, run_dir: Path, run_id: str, state: dict[str, Any] | None) -> None:
        pass

    def log(self, row: dict[str, Any]) -> None:
        pass

    def state(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass
