"""The JSONL metrics log, ``<run_dir>/logs/<run_id>.jsonl``: its writer (:class:`JSONLLogger`,
every built-in logger's, TensorBoard's included) and its one reader (:func:`read_log`).

One JSON object per line: a checkpoint point's history row (epoch, [batch,] step,
train_loss, lr, val{...}, seconds). The writer's state (the byte offset reached) is stored
in every record, so a resume truncates the lines written after the record and the log reads
as if the run had never stopped. Neither ``logs/`` nor the file is followed through a link.
The reader reads at most the last :data:`READ_MAX` bytes, skips (and counts) lines that are
no JSON object, and leaves out a last line still being written.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nitro_core.store.safeio import confined_dir, link_refusal, open_nofollow

READ_MAX = 32 * 1024 * 1024  # bytes read from the end of one log


def log_path(run_dir: Path, run_id: str) -> Path:
    return Path(run_dir) / "logs" / f"{run_id}.jsonl"


class JSONLLogger:
    """One JSON line per checkpoint point."""

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
        self.path = log_path(self.run_dir, run_id)
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


@dataclass(frozen=True)
class LogRows:
    """What :func:`read_log` read of one log."""

    rows: list[dict[str, Any]]
    skipped: int  # complete lines that are no JSON object
    cut: bool  # the log is over READ_MAX bytes: only its end was read


def read_log(run_dir: Path, run_id: str) -> LogRows:
    """The rows of ``logs/<run_id>.jsonl``. A missing log raises ``FileNotFoundError``; a
    link, or a FIFO or device in the log's place, :class:`~nitro_core.errors.UnsafePath`."""
    path = log_path(run_dir, run_id)
    fd = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise link_refusal(path)  # a FIFO or a device in a log's place is no log
        cut = st.st_size > READ_MAX
        f.seek(max(0, st.st_size - READ_MAX))
        data = f.read(READ_MAX)
    lines = data.split(b"\n")
    if cut:
        lines = lines[1:]  # the first one is cut
    lines = lines[:-1]  # after the last newline: empty, or a row being written
    rows, skipped = [], 0
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif line.strip():
            skipped += 1
    return LogRows(rows, skipped, cut)
