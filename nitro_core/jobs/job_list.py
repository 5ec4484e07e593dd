"""Reading the job store: one job's status by its id, every job's, and the jobs not known to
have ended, each refreshed by its executor (the job manager's ``refresh``).

Listing reads the job index (:mod:`nitro_core.jobs.index`) and the live jobs' own files,
never every job's: an ended job's row is final, and a live one found ended now is noted in
the index. Anything in the job store that is not a job (a stray file, a half-created
directory, a link, a copy holding another job's id) is skipped and logged; a link at
``.nitro`` or ``.nitro/jobs`` is refused (:mod:`nitro_core.jobs.files`).
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable
from pathlib import Path

from nitro_core.errors import CheckpointNotFound, UnsafePath, Worded
from nitro_core.jobs.files import (
    STORE_NAME,
    TERMINAL,
    JobState,
    JobStatus,
    job_dir,
    read_spec,
    read_status,
    real_dir,
)
from nitro_core.jobs.groups import group_state
from nitro_core.jobs.index import IndexRow, JobIndex


def jobs_listed(root: Path) -> Worded:
    """What lists the jobs under ``root``, in each audience's words."""
    here = Path.cwd() == root.resolve()
    return Worded(
        python="JobManager(root).list() lists the jobs there.",
        tool="nitro_jobs lists the jobs there.",
        terminal=f"nitro jobs{'' if here else ' --root ' + shlex.quote(str(root))} lists the "
        "jobs there.",
    )


log = logging.getLogger(__name__)


class JobListing:
    """The jobs under ``<root>/.nitro/jobs``, read; ``refresh`` brings a job's status up to
    date with its executor (a finished worker reaped, a vanished one found lost)."""

    def __init__(self, root: Path, refresh: Callable[[JobStatus], JobStatus]) -> None:
        self.root = root
        self.store_dir = root / STORE_NAME
        self.jobs_dir = self.store_dir / "jobs"
        self.index = JobIndex(self.store_dir, self.jobs_dir)
        self._refresh = refresh

    def read(self, job_id: str) -> JobStatus:
        """The job's status as its file has it; a job that is not there, or not one of ours,
        is :class:`CheckpointNotFound`; a link in its place, :class:`UnsafePath`."""
        try:
            status = read_status(job_dir(self.root, job_id))
        except UnsafePath:  # a link in place of the job or of one of its files: say so
            raise
        except (OSError, ValueError):  # missing, a file in place of the job, or not ours
            status = None
        if status is None or status.job_id != job_id:
            raise CheckpointNotFound(
                f"No job {job_id!r} under {str(self.jobs_dir)!r}; ", jobs_listed(self.root)
            )
        return status

    def statuses(self, state: JobState | None = None) -> list[JobStatus]:
        """Every job's status (of ``state``), refreshed, newest first: reads every job."""
        out = [self._refresh(s) for s in self.every()]
        out = [s for s in out if state is None or s.state == state]
        return sorted(out, key=lambda s: s.created, reverse=True)

    def page(
        self, rows: dict[str, IndexRow], state: JobState | None, start: int, limit: int
    ) -> tuple[list[IndexRow], bool]:
        """Jobs ``start`` to ``start + limit`` of the listing, newest first, and whether more
        follow: from the index (``rows``), with only the live jobs read from their own files."""
        current = [r for r in rows.values() if r.state in TERMINAL] + [
            IndexRow.of(s, rows[s.job_id].experiment, rows[s.job_id].group)
            for s in self.current(rows)
        ]  # a live job whose files cannot be read now is left out, as a full scan would
        listed = [r for r in self._collapsed(current) if state is None or r.state == state]
        listed.sort(key=lambda r: (r.created, r.job_id), reverse=True)
        return listed[start : start + limit], start + limit < len(listed)

    def _collapsed(self, rows: list[IndexRow]) -> list[IndexRow]:
        """``rows`` with the jobs of each seed group as one row: the group's id, its state
        (:func:`~nitro_core.jobs.groups.group_state`), its directory, its lowest epoch and
        its first job's creation; so a page counts a group once, and a state filter sees the
        group's state."""
        out: list[IndexRow] = []
        members: dict[str, list[IndexRow]] = {}
        for row in rows:
            if row.group is None:
                out.append(row)
            else:
                members.setdefault(row.group, []).append(row)
        for group_id, group_rows in members.items():
            statuses = [self._as_status(r) for r in group_rows]
            first = min(group_rows, key=lambda r: (r.created, r.job_id))
            out.append(IndexRow(
                job_id=group_id, kind="train", state=group_state(statuses),
                experiment=first.experiment, run_dir=str(Path(first.run_dir).parent),
                epoch=min(r.epoch for r in group_rows), created=first.created, group=group_id,
            ))  # fmt: skip
        return out

    def _as_status(self, row: IndexRow) -> JobStatus:
        """A row's job status: its file for a stopped job (whether it stopped at its budget),
        else what the row says."""
        if row.state == "stopped":
            status = _entry(job_dir(self.root, row.job_id))
            if status is not None:
                return status
        return JobStatus(job_id=row.job_id, kind=row.kind, state=row.state,
                         run_dir=row.run_dir, created=row.created)  # fmt: skip

    def live(self) -> list[JobStatus]:
        """The queued and running jobs' statuses, newest first: from the index, with only
        these jobs' own files read."""
        out = [s for s in self.current() if s.state not in TERMINAL]
        return sorted(out, key=lambda s: s.created, reverse=True)

    def every(self) -> list[JobStatus]:
        """Every job's status as its file has it; whatever else the job store holds is
        skipped."""
        if not (real_dir(self.store_dir) and real_dir(self.jobs_dir)):  # a link: refused
            return []
        out = []
        for directory in self.jobs_dir.iterdir():
            status = _entry(directory)
            if status is not None:
                out.append(status)
        return out

    def rows(self) -> dict[str, IndexRow]:
        """Every job's index row (an ended job's is final; a live one's state may be old)."""
        if not (real_dir(self.store_dir) and real_dir(self.jobs_dir)):  # a link: refused
            return {}
        return self.index.rows(self._index_row)

    def _index_row(self, name: str) -> IndexRow | None:
        status = _entry(self.jobs_dir / name)
        if status is None:
            return None
        try:
            spec = read_spec(self.jobs_dir / name)
        except (OSError, ValueError):  # being created right now: its next listing reads it
            return None
        return IndexRow.of(status, spec.experiment, spec.group)

    def current(self, rows: dict[str, IndexRow] | None = None) -> list[JobStatus]:
        """The statuses of the jobs not known to have ended (among ``rows``, by default
        the index's), read from their own files and refreshed; one found ended now is noted
        in the index."""
        out = []
        for row in (self.rows() if rows is None else rows).values():
            if row.state in TERMINAL:
                continue
            status = _entry(job_dir(self.root, row.job_id))
            if status is None:
                continue
            status = self._refresh(status)
            if status.state in TERMINAL:
                self.index.note(IndexRow.of(status, row.experiment, row.group))
            out.append(status)
        return out


def _entry(directory: Path) -> JobStatus | None:
    """The status of the job in ``directory``; None (logged) when it is not one: a link
    (never followed), unreadable or half-created, or a copy holding another job's id."""
    if directory.is_symlink():  # never followed: it could lead out of the root
        log.debug("skipping %s in the job store: it is a symbolic link", directory.name)
        return None
    try:
        status = read_status(directory)
    except (OSError, ValueError) as exc:  # being created right now, or not a job
        log.debug("skipping %s in the job store: %s", directory.name, exc)
        return None
    if status.job_id != directory.name:
        log.debug("skipping %s in the job store: it holds job %s", directory.name, status.job_id)
        return None
    return status
