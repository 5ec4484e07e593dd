"""The job manager: creates jobs, starts a worker process per job (at most ``max_jobs`` at
once, later ones queued), reports their state from their files, and stops them.

Workers run in their own session, so they outlive the server and a client's disconnect. A
worker that ends starts the next queued job itself (``pump``), so the queue drains with no
server or client attached. A new manager over the same root sees every earlier job; one
whose worker vanished without recording an end is reported as ``lost``. Anything in the job
store that is not a job (a stray file, a half-created directory, a link) is skipped; a link
at ``.nitro`` or ``.nitro/jobs`` is refused (:mod:`nitro_core.jobs.files`).
"""

from __future__ import annotations

import builtins
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nitro_core.errors import CheckpointNotFound, ConfigError, UnsafePath
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
from nitro_core.jobs.status import compare_and_set, update_status_if
from nitro_core.store.manifest import now_iso

log = logging.getLogger(__name__)


class JobManager:
    """Jobs under ``<root>/.nitro/jobs``."""

    def __init__(self, root: Path, max_jobs: int = 2) -> None:
        self.root = Path(root).resolve()
        self.max_jobs = max_jobs
        self.store_dir = self.root / STORE_NAME
        self.jobs_dir = self.store_dir / "jobs"
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # -- creating and starting ------------------------------------------------------------------
    def submit(self, **fields: Any) -> JobStatus:
        """Create a job from spec fields (validated already) and start it when a slot is free."""
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
        spec = JobSpec(job_id=job_id, created=now_iso(), max_jobs=self.max_jobs, **fields)
        write_json(directory / "spec.json", spec)
        status = JobStatus(
            job_id=job_id,
            kind=spec.kind,
            state="queued",
            run_dir=spec.run_dir,
            created=spec.created,
        )
        write_json(directory / "status.json", status)
        append_event(directory, {"time": spec.created, "event": "queued"})
        self.pump()
        return self.status(job_id)

    def pump(self) -> None:
        """Start queued jobs, oldest first, while fewer than ``max_jobs`` run. Servers and
        ending workers pump under one lock, so together they never exceed ``max_jobs``."""
        if not any(s.state == "queued" for s in self._all()):
            return  # nothing to start (the common case: no lock, no file written)
        with locked(self.store_dir, "pump.lock"):
            statuses = [self._refresh(s) for s in self._all()]
            running = sum(s.state == "running" for s in statuses)
            queued = sorted((s for s in statuses if s.state == "queued"), key=lambda s: s.created)
            for s in queued:
                if running >= self.max_jobs:
                    break
                self._launch(s.job_id)
                running += 1

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
        """Every job, newest first."""
        self.pump()
        out = [self._refresh(s) for s in self._all()]
        out = [s for s in out if state is None or s.state == state]
        return sorted(out, key=lambda s: s.created, reverse=True)

    def _all(self) -> builtins.list[JobStatus]:  # builtins: the method list() shadows it
        """Every job's status; whatever else the job store holds is skipped."""
        if not (real_dir(self.store_dir) and real_dir(self.jobs_dir)):  # a link: refused
            return []
        out = []
        for directory in self.jobs_dir.iterdir():
            if directory.is_symlink():  # never followed: it could lead out of the root
                log.debug("skipping %s in the job store: it is a symbolic link", directory.name)
                continue
            try:
                status = read_status(directory)
            except (OSError, ValueError) as exc:  # being created right now, or not a job
                log.debug("skipping %s in the job store: %s", directory.name, exc)
                continue
            if status.job_id != directory.name:
                log.debug(
                    "skipping %s in the job store: it holds job %s", directory.name, status.job_id
                )
                continue
            out.append(status)
        return out

    def _refresh(self, status: JobStatus) -> JobStatus:
        """Reap a finished child; mark a running job whose worker vanished as lost."""
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
        else:
            ended = compare_and_set(
                directory, vanished, state="lost", phase="lost", ended=now_iso(),
                error=f"The worker process {status.pid} ended without recording a result "
                "(killed, or the machine restarted).",
                hint="Its run stays resumable: call nitro_train with the same experiment and "
                "run_dir and resume='auto'. The log tail shows its last words.",
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
            directory, {"running"}, state="stopped", phase="killed", ended=now_iso(),
            hint="Killed at once; resume the run with nitro_train(resume='auto').",
        )  # fmt: skip
        self.pump()
        return killed if killed is not None else read_status(directory)


def _launching(status: JobStatus) -> bool:
    """Claimed by a server that has not recorded the worker's pid yet (a moment, normally)."""
    if status.pid is not None or status.phase != "launching" or status.started is None:
        return False
    started = datetime.fromisoformat(status.started.replace("Z", "+00:00"))
    return (datetime.now(UTC) - started).total_seconds() < 30
