"""The job index, ``<root>/.nitro/jobs-index.jsonl``: what listing jobs and starting queued
ones read instead of every job's ``status.json``.

One JSON line per job when it is created, and one when it is first seen ended. The index
is a cache of the job directories, never their authority:

- a terminal state is final (:mod:`nitro_core.jobs.status`), so an ended job is listed
  from its line; a job last seen queued or running is read from its own files (the live
  jobs: a handful);
- every use compares the index with the names in ``jobs/`` (one ``scandir``, no file
  read): a directory it lacks (made by another server, or before the index existed) is
  read once and appended; a line whose directory is gone (pruned) is dropped;
- a missing index is rebuilt from the directories (the one full scan), and one grown past
  three lines a job is rewritten, both atomically; a line lost to a race with a rewrite is
  found again by the comparison above.

Lines are appended in one ``write`` each and read incrementally (only the bytes appended
since the last read). The file is never opened through a link: a link or a non-file in its
place is left alone (logged once), and the index is then kept in memory only.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from nitro_core.errors import RecordError, UnsafePath
from nitro_core.jobs.files import TERMINAL, WHERE, JobKind, JobState, JobStatus, locked
from nitro_core.store.atomic import Replace
from nitro_core.store.safeio import open_nofollow, read_capped

log = logging.getLogger(__name__)

INDEX_NAME = "jobs-index.jsonl"
GROWN = 3  # lines a job before the file is rewritten


class IndexRow(BaseModel):
    """What a listing shows of one job."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    kind: JobKind
    state: JobState
    experiment: str | None
    run_dir: str
    epoch: int = 0
    created: str
    group: str | None = None  # its seed group, if it is one job of one

    @classmethod
    def of(cls, status: JobStatus, experiment: str | None, group: str | None = None) -> IndexRow:
        return cls(
            job_id=status.job_id, kind=status.kind, state=status.state, experiment=experiment,
            run_dir=status.run_dir, epoch=status.epoch, created=status.created, group=group,
        )  # fmt: skip


class JobIndex:
    """The index of the jobs under ``jobs_dir``, kept in ``store_dir``."""

    def __init__(self, store_dir: Path, jobs_dir: Path) -> None:
        self.path = store_dir / INDEX_NAME
        self.jobs_dir = jobs_dir
        self._rows: dict[str, IndexRow] = {}
        self._lines = 0  # lines read from the current file
        self._offset = 0  # bytes of it read
        self._file: tuple[int, int] | None = None  # (device, inode) of the file read
        self._memory_only = False
        self._lock = threading.Lock()  # the server's threads share one index

    def rows(self, read: Callable[[str], IndexRow | None]) -> dict[str, IndexRow]:
        """Every job by id, as the index and the directory names say; ``read(name)`` reads a
        directory the index lacks (None: not a job, skipped)."""
        with self._lock:
            return self._rows_now(read)

    def note(self, row: IndexRow) -> None:
        """Record a new job, or a job's end."""
        with self._lock:
            self._rows[row.job_id] = row
            self._append([row])

    def _rows_now(self, read: Callable[[str], IndexRow | None]) -> dict[str, IndexRow]:
        names = _names(self.jobs_dir)
        if not names:
            self._rows.clear()
            return {}  # no job: nothing is read or written
        found = self._load()
        for gone in self._rows.keys() - names:  # pruned, or never a job of ours
            del self._rows[gone]
        new = [row for name in sorted(names - self._rows.keys()) if (row := read(name))]
        for row in new:
            self._rows[row.job_id] = row
        if not found or self._lines > GROWN * len(self._rows) + 64:
            self._rewrite()
        elif new:
            self._append(new)
        return dict(self._rows)

    # -- the file ---------------------------------------------------------------------------
    def _load(self) -> bool:
        """Take in the lines appended since the last read; False when there is no file."""
        if self._memory_only:
            return True
        try:
            fd = open_nofollow(self.path, os.O_RDONLY | os.O_NONBLOCK, where=WHERE)
        except FileNotFoundError:
            self._forget()
            return False
        except UnsafePath:
            self._leave_alone("a symbolic link")
            return True
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                self._leave_alone("not a regular file")
                return True
            if (st.st_dev, st.st_ino) != self._file or st.st_size < self._offset:
                self._forget()  # rewritten by another process: read it whole
                self._file = (st.st_dev, st.st_ino)
            f.seek(self._offset)
            try:
                data = read_capped(f, "job index", str(self.path))
            except RecordError:  # a cache: the job directories still say everything
                self._leave_alone("over its size limit")
                return True
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        for line in data[:end].splitlines():
            self._lines += 1
            try:
                row = IndexRow.model_validate_json(line)
            except ValueError:  # torn or foreign: the directories correct it
                continue
            seen = self._rows.get(row.job_id)
            if seen is None or seen.state not in TERMINAL:  # an end is final
                self._rows[row.job_id] = row
        self._offset += end
        return True

    def _append(self, rows: list[IndexRow]) -> None:
        if self._memory_only:
            return
        body = b"".join(row.model_dump_json().encode() + b"\n" for row in rows)
        try:  # no O_CREAT: a missing index is rebuilt whole, never started from one line
            fd = open_nofollow(self.path, os.O_WRONLY | os.O_APPEND, where=WHERE)
        except FileNotFoundError:
            return
        except UnsafePath:
            self._leave_alone("a symbolic link")
            return
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.write(fd, body)  # O_APPEND: one write lands whole after the others
        finally:
            os.close(fd)

    def _rewrite(self) -> None:
        """Write the index whole (missing, or grown), atomically, one process at a time. A
        failure (a full disk) is logged: the index is a cache, and listing goes on."""
        if self._memory_only or not self._rows:
            return
        rows = sorted(self._rows.values(), key=lambda r: (r.created, r.job_id))
        body = b"".join(row.model_dump_json().encode() + b"\n" for row in rows)
        try:
            with locked(self.path.parent, "index.lock"):  # one .tmp at a time
                Replace(self.path).commit(lambda f: f.write(body))  # never follows a link
                st = os.lstat(self.path)
        except UnsafePath:  # the lock file is a link: refused, like every job store lock
            raise
        except OSError as exc:
            log.warning("the job index %s was not rewritten: %s", self.path, exc)
            return
        self._file, self._offset, self._lines = (st.st_dev, st.st_ino), len(body), len(rows)

    def _forget(self) -> None:
        self._rows.clear()
        self._file, self._offset, self._lines = None, 0, 0

    def _leave_alone(self, what: str) -> None:
        log.warning(
            "the job index %s is %s; it is left alone, and this process keeps its index in memory",
            self.path, what,
        )  # fmt: skip
        self._memory_only = True


def _names(jobs_dir: Path) -> set[str]:
    """The entry names of the job store (its links and stray files included: the caller's
    reader skips them)."""
    try:
        with os.scandir(jobs_dir) as it:
            return {e.name for e in it}
    except (FileNotFoundError, NotADirectoryError):
        return set()
