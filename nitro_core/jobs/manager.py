"""The job manager: the jobs of one root. It creates a job (its directory, spec, status and
first event under ``<root>/.nitro/jobs``), hands it to its executor, starts queued local jobs
while slots are free (``pump``), and answers for a job by its id: its status, its spec, a
stop, and the removal of old ended jobs.

Each job runs through an executor (:mod:`nitro_core.jobs.executor`): ``local`` worker
processes started from Nitro's own queue (:mod:`nitro_core.jobs.local`), or ``slurm``. A
worker that ends starts the next queued job itself (``pump``), so the queue drains with no
server or client attached. A new manager over the same root sees every earlier job; reading
the job store, listings included, is :mod:`nitro_core.jobs.job_list`.
"""

from __future__ import annotations

import builtins
import os
import secrets
import shutil
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from nitro_core.errors import CheckpointNotFound, ConfigError, UnsafePath, Worded
from nitro_core.jobs.call_models import Call
from nitro_core.jobs.executor import Executor, SlurmExecutor
from nitro_core.jobs.files import (
    TERMINAL,
    JobSpec,
    JobState,
    JobStatus,
    alive,
    append_event,
    job_dir,
    locked,
    read_spec,
    read_status,
    real_dir,
    write_json,
)
from nitro_core.jobs.index import IndexRow
from nitro_core.jobs.job_list import JobListing, jobs_listed
from nitro_core.jobs.local import LocalExecutor, startable
from nitro_core.store.manifest import now_iso


def new_job_id() -> str:
    """A new job's id: the time it was made and 6 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


class JobManager:
    """Jobs under ``<root>/.nitro/jobs``. Trainings and evaluations (validate, average)
    queue separately: an evaluation never waits behind ``max_jobs`` trainings."""

    def __init__(
        self, root: Path, max_jobs: int = 2, max_eval_jobs: int = 2, warm: bool = False
    ) -> None:
        """``warm``: evaluations run in a warm worker this manager keeps (a server's);
        :meth:`close` lets it end."""
        self.root = Path(root).resolve()
        self.max_jobs = max_jobs
        self.max_eval_jobs = max_eval_jobs
        self.listing = JobListing(self.root, self._refresh)
        self.store_dir = self.listing.store_dir
        self.jobs_dir = self.listing.jobs_dir
        self.local = LocalExecutor(self.root, self.pump, warm=warm)
        self.executors: dict[str, Executor] = {
            "local": self.local,
            "slurm": SlurmExecutor(self.root),
        }

    # -- creating and starting ------------------------------------------------------------------
    def submit(
        self,
        call: Call,
        after: str | None = None,
        experiment_modules: Sequence[str] = (),
        group: str | None = None,
        job_id: str | None = None,
    ) -> JobStatus:
        """Create a job running ``call`` (validated already) and start it when a slot is
        free; ``after``: a job it waits for; ``experiment_modules``: what its worker imports;
        ``group``: the seed group it is one job of; ``job_id``: one :func:`new_job_id` gave
        (a group names its jobs before they exist)."""
        job_id = new_job_id() if job_id is None else job_id
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
            group=group,
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
        self.listing.index.note(IndexRow.of(status, spec.experiment, group))
        self.executors[status.executor].submit(directory, spec)
        return self.status(job_id)

    def pump(self, rows: dict[str, IndexRow] | None = None) -> None:
        """Start queued local jobs, oldest first, while a slot of their kind is free
        (:func:`~nitro_core.jobs.local.startable`). Servers and ending workers pump under one
        lock, so together they never exceed either limit. ``rows``: the index as the caller
        just read it."""
        current = self.listing.current(rows)
        if not any(s.state == "queued" and s.executor == "local" for s in current):
            return  # nothing to start (the common case: no lock, no file written)
        with locked(self.store_dir, "pump.lock"):
            statuses = [s for s in self.listing.current() if s.executor == "local"]  # refreshed
            for job_id in startable(statuses, self.max_jobs, self.max_eval_jobs, self.root):
                self.local.launch(job_id)

    def close(self) -> None:
        """This manager's server ends: its warm worker finishes the job in hand and ends."""
        self.local.close()

    # -- reading --------------------------------------------------------------------------------
    def status(self, job_id: str) -> JobStatus:
        status = self._refresh(self.listing.read(job_id))
        if status.state == "queued" or status.state in TERMINAL:
            self.pump()  # a queued job may start now, or this one's end freed a slot
            status = read_status(job_dir(self.root, job_id))
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
                f"({type(exc).__name__}); it was not created by Nitro. ",
                jobs_listed(self.root),
            ) from None

    def list(self, state: JobState | None = None) -> builtins.list[JobStatus]:
        """Every job's full status, newest first (reads every job: ``page`` is the cheap
        listing)."""
        self.pump()
        return self.listing.statuses(state)

    def page(
        self, state: JobState | None, start: int, limit: int
    ) -> tuple[builtins.list[IndexRow], bool]:
        """Jobs ``start`` to ``start + limit`` of the listing, newest first, and whether more
        follow: from the index, with only the live jobs read from their own files."""
        rows = self.listing.rows()
        self.pump(rows)
        return self.listing.page(rows, state, start, limit)

    def live(self) -> builtins.list[JobStatus]:
        """The queued and running jobs' full statuses, newest first: from the index, with
        only these jobs' own files read (``list`` reads every job)."""
        return self.listing.live()

    def _refresh(self, status: JobStatus) -> JobStatus:
        """The job's status as its executor has it now (a vanished worker: lost)."""
        directory = job_dir(self.root, status.job_id)
        return self.executors[status.executor].refresh(directory, status)

    # -- stopping ---------------------------------------------------------------------------------
    def stop(self, job_id: str, force: bool = False) -> JobStatus:
        """Graceful: the worker finishes its epoch, validates and checkpoints. ``force``
        kills it now; the run stays resumable with ``resume="auto"``. A result the worker
        recorded before the stop landed stands."""
        status = self.status(job_id)
        if status.state in TERMINAL:
            raise ConfigError(
                f"Job {job_id} already ended ({status.state}); there is nothing to stop. ",
                Worded(
                    python=f"JobManager.status({job_id!r}) shows its result.",
                    tool="nitro_status shows its result.",
                    terminal=f"nitro status {job_id} shows its result.",
                ),
            )
        return self.executors[status.executor].stop(job_dir(self.root, job_id), status, force)

    # -- pruning ----------------------------------------------------------------------------------
    def prune(self, older_than_s: float, dry_run: bool = True) -> builtins.list[tuple[str, int]]:
        """The ended jobs (succeeded, failed, stopped, lost) that ended more than
        ``older_than_s`` seconds ago and whose worker is gone, oldest first, with the bytes
        of their directories; unless ``dry_run``, those directories are removed. A queued or
        running job is never one of them."""
        now = datetime.now(UTC)
        out = []
        for status in sorted(self.listing.every(), key=lambda s: s.ended or s.created):
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


def _bytes_in(directory: Path) -> int:
    """Bytes of the regular files directly in a job's directory (no link followed)."""
    with os.scandir(directory) as it:
        return sum(
            e.stat(follow_symlinks=False).st_size for e in it if e.is_file(follow_symlinks=False)
        )
