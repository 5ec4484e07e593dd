"""The job manager: creates jobs, starts a worker process per job (at most ``max_jobs``
trainings and, in slots of their own, ``max_eval_jobs`` validations and averages at once;
later ones queued), reports their state from their files, and stops them.

Workers run in their own session, so they outlive the server and a client's disconnect. A
worker that ends starts the next queued job itself (``pump``), so the queue drains with no
server or client attached. A new manager over the same root sees every earlier job; one
whose worker vanished without recording an end is reported as ``lost``. Anything in the job
store that is not a job (a stray file, a half-created directory, a link) is skipped; a link
at ``.nitro`` or ``.nitro/jobs`` is refused (:mod:`nitro_core.jobs.files`). Listing and
starting queued jobs read the job index (:mod:`nitro_core.jobs.index`) and the live jobs'
own files, never every job's.
"""

from __future__ import annotations

import builtins
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from nitro_core.errors import CheckpointNotFound, ConfigError, UnsafePath
from nitro_core.jobs import cluster, slurm
from nitro_core.jobs.call_models import Call
from nitro_core.jobs.files import (
    STORE_NAME,
    TERMINAL,
    JobSpec,
    JobState,
    JobStatus,
    alive,
    append_event,
    job_dir,
    locked,
    note_event,
    open_log,
    read_spec,
    read_status,
    real_dir,
    write_json,
)
from nitro_core.jobs.index import IndexRow, JobIndex
from nitro_core.jobs.status import compare_and_set, update_status_if
from nitro_core.store.manifest import now_iso

log = logging.getLogger(__name__)


class JobManager:
    """Jobs under ``<root>/.nitro/jobs``. Trainings and evaluations (validate, average)
    queue separately: an evaluation never waits behind ``max_jobs`` trainings."""

    def __init__(self, root: Path, max_jobs: int = 2, max_eval_jobs: int = 2) -> None:
        self.root = Path(root).resolve()
        self.max_jobs = max_jobs
        self.max_eval_jobs = max_eval_jobs
        self.store_dir = self.root / STORE_NAME
        self.jobs_dir = self.store_dir / "jobs"
        self.index = JobIndex(self.store_dir, self.jobs_dir)
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self.engine = slurm.Engine()  # the cluster's scheduler, asked at most once a second a job

    # -- creating and starting ------------------------------------------------------------------
    def submit(
        self, call: Call, after: str | None = None, experiment_modules: Sequence[str] = ()
    ) -> JobStatus:
        """Create a job running ``call`` (validated already) and start it when a slot is
        free; ``after``: a job it waits for; ``experiment_modules``: what its worker imports."""
        job_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
        directory = job_dir(self.root, job_id)
        for d in (self.store_dir, self.jobs_dir):
            real_dir(d)  # a link is refused before anything is created through it
        try:
            directory.mkdir(parents=True)
        except OSError as exc:  # .nitro or .nitro/jobs is a file, or the disk refuses
            raise ConfigError(
                f"Cannot create the job directory {str(directory)!r}: {exc.strerror}. The job "
                f"store {str(self.jobs_dir)!r} must be a writable directory; move whatever "
                "occupies that path away and call again."
            ) from None
        spec = JobSpec(
            job_id=job_id, kind=call.kind, call=call, experiment_modules=list(experiment_modules),
            after=after, created=now_iso(), max_jobs=self.max_jobs, max_eval_jobs=self.max_eval_jobs,
        )  # fmt: skip
        write_json(directory / "spec.json", spec)
        status = JobStatus(
            job_id=job_id,
            kind=spec.kind,
            state="queued",
            run_dir=spec.run_dir,
            created=spec.created,
            executor=getattr(call, "executor", None) or "local",
        )
        write_json(directory / "status.json", status)
        append_event(directory, {"time": spec.created, "event": "queued"})
        self.index.note(IndexRow.of(status, spec.experiment))
        if status.executor == "slurm":  # the cluster's scheduler queues it, not Nitro's slots
            cluster.start(directory, spec, self.root)
        else:
            self.pump()
        return self.status(job_id)

    def pump(self, rows: dict[str, IndexRow] | None = None) -> None:
        """Start queued jobs, oldest first, while a slot of their kind is free: fewer than
        ``max_jobs`` trainings, or fewer than ``max_eval_jobs`` validations and averages,
        running. Servers and ending workers pump under one lock, so together they never
        exceed either limit. ``rows``: the index as the caller just read it."""
        if not any(s.state == "queued" and s.executor == "local" for s in self._live(rows)):
            return  # nothing to start (the common case: no lock, no file written)
        with locked(self.store_dir, "pump.lock"):
            statuses = [s for s in self._live() if s.executor == "local"]  # not ended, refreshed
            limit = {True: self.max_jobs, False: self.max_eval_jobs}  # by "is a training"
            running = {True: 0, False: 0}
            for s in statuses:
                running[s.kind == "train"] += s.state == "running"
            queued = sorted((s for s in statuses if s.state == "queued"), key=lambda s: s.created)
            for s in queued:
                train = s.kind == "train"
                if running[train] >= limit[train]:
                    continue
                if _waits(self.root, s.job_id, statuses):  # queued behind a job not yet ended
                    continue
                self._launch(s.job_id)
                running[train] += 1

    def _launch(self, job_id: str) -> None:
        directory = job_dir(self.root, job_id)
        if (
            update_status_if(
                directory, {"queued"}, state="running", phase="launching", started=now_iso()
            )
            is None
        ):
            return  # another server claimed it, or it was stopped meanwhile
        try:
            with open_log(directory) as log_file:  # the child keeps its own copy
                child = subprocess.Popen(
                    # -P: the root (cwd) is not on sys.path, so files there cannot shadow modules
                    [sys.executable, "-P", "-m", "nitro_core.jobs.worker", str(directory)],
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    cwd=self.root,
                    start_new_session=True,  # outlives the server and a client's disconnect
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
        except UnsafePath as exc:  # log.txt is a link
            update_status_if(
                directory, {"running"}, state="failed", phase="failed", ended=now_iso(),
                error=str(exc), hint="Remove the link, then submit the job again.",
            )  # fmt: skip
            return
        except OSError as exc:
            update_status_if(
                directory, {"running"}, state="failed", phase="failed", ended=now_iso(),
                error=f"Cannot start the worker process: {exc}.",
                hint="Check that the server's Python can run 'python -m nitro_core.jobs.worker', "
                "then call again.",
            )  # fmt: skip
            return
        self._children[job_id] = child
        # only a worker that has not yet reported itself: a fast one may have ended already
        compare_and_set(
            directory,
            lambda s: s.state == "running" and s.pid is None,
            phase="starting",
            pid=child.pid,
        )

    # -- reading --------------------------------------------------------------------------------
    def status(self, job_id: str) -> JobStatus:
        directory = job_dir(self.root, job_id)
        status = self._refresh(self._read(directory, job_id))
        if status.state == "queued" or status.state in TERMINAL:
            self.pump()  # a queued job may start now, or this one's end freed a slot
            status = read_status(directory)
        return status

    def spec(self, job_id: str) -> JobSpec:
        self.status(job_id)
        try:
            return read_spec(job_dir(self.root, job_id))
        except UnsafePath:
            raise
        except (OSError, ValueError) as exc:
            raise CheckpointNotFound(
                f"Job {job_id!r} under {str(self.jobs_dir)!r} has no readable spec.json "
                f"({type(exc).__name__}); it was not created by Nitro. nitro_jobs lists the jobs."
            ) from None

    def _read(self, directory: Path, job_id: str) -> JobStatus:
        try:
            status = read_status(directory)
        except UnsafePath:  # a link in place of the job or of one of its files: say so
            raise
        except (OSError, ValueError):  # missing, a file in place of the job, or not ours
            status = None
        if status is None or status.job_id != job_id:
            raise CheckpointNotFound(
                f"No job {job_id!r} under {str(self.jobs_dir)!r}; nitro_jobs lists the jobs there."
            )
        return status

    def list(self, state: JobState | None = None) -> builtins.list[JobStatus]:
        """Every job's full status, newest first (reads every job: ``page`` is the cheap
        listing)."""
        self.pump()
        out = [self._refresh(s) for s in self._all()]
        out = [s for s in out if state is None or s.state == state]
        return sorted(out, key=lambda s: s.created, reverse=True)

    def page(
        self, state: JobState | None, start: int, limit: int
    ) -> tuple[builtins.list[IndexRow], bool]:
        """Jobs ``start`` to ``start + limit`` of the listing, newest first, and whether more
        follow: from the index, with only the live jobs read from their own files."""
        rows = self._rows()
        self.pump(rows)
        current = [r for r in rows.values() if r.state in TERMINAL] + [
            IndexRow.of(s, rows[s.job_id].experiment) for s in self._live(rows)
        ]  # a live job whose files cannot be read now is left out, as a full scan would
        listed = [r for r in current if state is None or r.state == state]
        listed.sort(key=lambda r: (r.created, r.job_id), reverse=True)
        return listed[start : start + limit], start + limit < len(listed)

    def live(self) -> builtins.list[JobStatus]:
        """The queued and running jobs' full statuses, newest first: from the index, with
        only these jobs' own files read (``list`` reads every job)."""
        out = [s for s in self._live() if s.state not in TERMINAL]
        return sorted(out, key=lambda s: s.created, reverse=True)

    def _all(self) -> builtins.list[JobStatus]:  # builtins: the method list() shadows it
        """Every job's status; whatever else the job store holds is skipped."""
        if not (real_dir(self.store_dir) and real_dir(self.jobs_dir)):  # a link: refused
            return []
        out = []
        for directory in self.jobs_dir.iterdir():
            status = _entry(directory)
            if status is not None:
                out.append(status)
        return out

    def _rows(self) -> dict[str, IndexRow]:
        """Every job's index row (an ended job's is final; a live one's state may be old)."""
        if not (real_dir(self.store_dir) and real_dir(self.jobs_dir)):  # a link: refused
            return {}
        return self.index.rows(self._index_row)

    def _index_row(self, name: str) -> IndexRow | None:
        status = _entry(self.jobs_dir / name)
        if status is None:
            return None
        try:
            experiment = read_spec(self.jobs_dir / name).experiment
        except (OSError, ValueError):  # being created right now: its next listing reads it
            return None
        return IndexRow.of(status, experiment)

    def _live(self, rows: dict[str, IndexRow] | None = None) -> builtins.list[JobStatus]:
        """The statuses of the jobs not known to have ended (among ``rows``, by default
        the index's), read from their own files and refreshed; one found ended now is noted
        in the index."""
        out = []
        for row in (self._rows() if rows is None else rows).values():
            if row.state in TERMINAL:
                continue
            status = _entry(job_dir(self.root, row.job_id))
            if status is None:
                continue
            status = self._refresh(status)
            if status.state in TERMINAL:
                self.index.note(IndexRow.of(status, row.experiment))
            out.append(status)
        return out

    def _refresh(self, status: JobStatus) -> JobStatus:
        """Reap a finished child; mark a running job whose worker vanished as lost."""
        if status.executor == "slurm" and status.state in ("queued", "running"):
            return cluster.refresh(job_dir(self.root, status.job_id), status, self.engine)
        child = self._children.get(status.job_id)
        if child is not None and child.poll() is not None:
            self._children.pop(status.job_id, None)
        if status.state != "running" or alive(status.pid, status.pid_start) or _launching(status):
            return status
        directory = job_dir(self.root, status.job_id)

        def vanished(s: JobStatus) -> bool:  # checked again under the lock: it may have ended
            return s.state == "running" and not alive(s.pid, s.pid_start) and not _launching(s)

        if status.stop_requested:  # SIGTERM reached it before it could record the stop
            ended = compare_and_set(
                directory, vanished, state="stopped", phase="cancelled", ended=now_iso()
            )
            event = "stopped"
        else:  # the MCP layer writes the call that continues its run
            ended = compare_and_set(
                directory, vanished, state="lost", phase="lost", ended=now_iso(),
                error=f"The worker process {status.pid} ended without recording a result "
                "(killed, or the machine restarted).",
            )  # fmt: skip
            event = "lost"
        if ended is None:
            return read_status(directory)
        note_event(directory, {"time": now_iso(), "event": event})
        return ended

    # -- stopping ---------------------------------------------------------------------------------
    def stop(self, job_id: str, force: bool = False) -> JobStatus:
        """Graceful: the worker finishes its epoch, validates and checkpoints. ``force``
        kills it now; the run stays resumable with ``resume="auto"``. A result the worker
        recorded before the stop landed stands."""
        status = self.status(job_id)
        directory = job_dir(self.root, job_id)
        if status.state in TERMINAL:
            raise ConfigError(
                f"Job {job_id} already ended ({status.state}); there is nothing to stop. "
                "nitro_status shows its result."
            )
        if status.executor == "slurm":
            return cluster.stop(directory, status, force)
        if status.state == "queued":
            cancelled = update_status_if(
                directory, {"queued"}, state="stopped", phase="cancelled", ended=now_iso()
            )
            if cancelled is not None:
                note_event(directory, {"time": now_iso(), "event": "stopped"})
                self.pump()
                return cancelled
        # the flag first: a worker without a pid yet reads it when it starts, and one that
        # misses the signal reads it at its next safe point
        flagged = update_status_if(directory, {"running"}, stop_requested=True)
        if flagged is None or flagged.pid is None:
            return read_status(directory)
        sig = signal.SIGKILL if force else signal.SIGTERM
        try:
            os.killpg(flagged.pid, sig) if force else os.kill(flagged.pid, sig)
        except ProcessLookupError:
            return self._refresh(read_status(directory))
        note_event(directory, {"time": now_iso(), "event": "kill" if force else "stop_requested"})
        if not force:
            return read_status(directory)
        child = self._children.pop(job_id, None)
        if child is not None:
            child.wait(timeout=10)
        killed = update_status_if(
            directory, {"running"}, state="stopped", phase="killed", ended=now_iso()
        )  # the MCP layer writes the call that resumes it
        self.pump()
        return killed if killed is not None else read_status(directory)

    # -- pruning ----------------------------------------------------------------------------------
    def prune(self, older_than_s: float, dry_run: bool = True) -> builtins.list[tuple[str, int]]:
        """The ended jobs (succeeded, failed, stopped, lost) that ended more than
        ``older_than_s`` seconds ago and whose worker is gone, oldest first, with the bytes
        of their directories; unless ``dry_run``, those directories are removed. A queued or
        running job is never one of them."""
        now = datetime.now(UTC)
        out = []
        for status in sorted(self._all(), key=lambda s: s.ended or s.created):
            when = datetime.fromisoformat((status.ended or status.created).replace("Z", "+00:00"))
            if (
                status.state not in TERMINAL
                or alive(status.pid, status.pid_start)
                or (now - when).total_seconds() <= older_than_s
            ):
                continue
            directory = job_dir(self.root, status.job_id)
            out.append((status.job_id, _bytes_in(directory)))
            if not dry_run:
                shutil.rmtree(directory)  # removes links inside, never what they point to
        return out


def _waits(root: Path, job_id: str, statuses: builtins.list[JobStatus]) -> bool:
    """Whether the queued job names (``after``) a job that is still queued or running."""
    try:
        after = read_spec(job_dir(root, job_id)).after
    except (OSError, ValueError):  # unreadable: it fails on its own when it starts
        return False
    return after is not None and any(
        s.job_id == after and s.state not in TERMINAL for s in statuses
    )


def _bytes_in(directory: Path) -> int:
    """Bytes of the regular files directly in a job's directory (no link followed)."""
    with os.scandir(directory) as it:
        return sum(
            e.stat(follow_symlinks=False).st_size for e in it if e.is_file(follow_symlinks=False)
        )


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


def _launching(status: JobStatus) -> bool:
    """Claimed by a server that has not recorded the worker's pid yet (a moment, normally)."""
    if status.pid is not None or status.phase != "launching" or status.started is None:
        return False
    started = datetime.fromisoformat(status.started.replace("Z", "+00:00"))
    return (datetime.now(UTC) - started).total_seconds() < 30
