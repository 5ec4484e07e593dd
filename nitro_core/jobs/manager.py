"""The job manager: creates jobs, starts a worker process per job (at most ``max_jobs`` at
once, later ones queued), reports their state from their files, and stops them.

Workers run in their own session, so they outlive the server and a client's disconnect. A
new manager over the same root sees every earlier job; one whose worker vanished without
recording an end is reported as ``lost``.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nitro_core.errors import CheckpointNotFound, ConfigError
from nitro_core.jobs.files import (
    TERMINAL,
    JobSpec,
    JobState,
    JobStatus,
    alive,
    append_event,
    job_dir,
    read_spec,
    read_status,
    write_json,
)
from nitro_core.jobs.status import update_status, update_status_if
from nitro_core.manifest import now_iso


class JobManager:
    """Jobs under ``<root>/.nitro/jobs``."""

    def __init__(self, root: Path, max_jobs: int = 2) -> None:
        self.root = Path(root).resolve()
        self.max_jobs = max_jobs
        self.jobs_dir = self.root / ".nitro" / "jobs"
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # -- creating and starting ------------------------------------------------------------------
    def submit(self, **fields: Any) -> JobStatus:
        """Create a job from spec fields (validated already) and start it when a slot is free."""
        job_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
        directory = job_dir(self.root, job_id)
        directory.mkdir(parents=True)
        spec = JobSpec(job_id=job_id, created=now_iso(), **fields)
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
        """Start queued jobs, oldest first, while fewer than ``max_jobs`` run."""
        statuses = [self._refresh(s) for s in self._all()]
        running = sum(s.state == "running" for s in statuses)
        for s in sorted((s for s in statuses if s.state == "queued"), key=lambda s: s.created):
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
        log = open(directory / "log.txt", "ab")  # noqa: SIM115 - handed to the child
        try:
            child = subprocess.Popen(
                # -P: the root (cwd) is not put on sys.path, so files there cannot shadow modules
                [sys.executable, "-P", "-m", "nitro_core.jobs.worker", str(directory)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,  # outlives the server and a client's disconnect
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            log.close()
        self._children[job_id] = child
        update_status(
            directory, state="running", phase="starting", pid=child.pid, started=now_iso()
        )

    # -- reading --------------------------------------------------------------------------------
    def status(self, job_id: str) -> JobStatus:
        directory = job_dir(self.root, job_id)
        if not (directory / "status.json").is_file():
            raise CheckpointNotFound(
                f"No job {job_id!r} under {str(self.jobs_dir)!r}; nitro_jobs lists the jobs there."
            )
        status = self._refresh(read_status(directory))
        if status.state == "queued" or status.state in TERMINAL:
            self.pump()  # a queued job may start now, or this one's end freed a slot
            status = read_status(directory)
        return status

    def spec(self, job_id: str) -> JobSpec:
        self.status(job_id)
        return read_spec(job_dir(self.root, job_id))

    def list(self, state: JobState | None = None) -> list[JobStatus]:
        """Every job, newest first."""
        self.pump()
        out = [self._refresh(s) for s in self._all()]
        out = [s for s in out if state is None or s.state == state]
        return sorted(out, key=lambda s: s.created, reverse=True)

    def _all(self) -> list[JobStatus]:
        if not self.jobs_dir.is_dir():
            return []
        out = []
        for directory in self.jobs_dir.iterdir():
            try:
                out.append(read_status(directory))
            except (FileNotFoundError, ValueError):
                continue  # a job being created right now
        return out

    def _refresh(self, status: JobStatus) -> JobStatus:
        """Reap a finished child; mark a running job whose worker vanished as lost."""
        child = self._children.get(status.job_id)
        if child is not None and child.poll() is not None:
            self._children.pop(status.job_id, None)
        if status.state != "running" or alive(status.pid, status.pid_start) or _launching(status):
            return status
        directory = job_dir(self.root, status.job_id)
        status = read_status(directory)  # the worker may have written its end just now
        if status.state != "running":
            return status
        if status.stop_requested:  # SIGTERM reached it before it could record the stop
            append_event(directory, {"time": now_iso(), "event": "stopped"})
            return update_status(directory, state="stopped", phase="cancelled", ended=now_iso())
        append_event(directory, {"time": now_iso(), "event": "lost"})
        return update_status(
            directory,
            state="lost",
            phase="lost",
            ended=now_iso(),
            error=f"The worker process {status.pid} ended without recording a result (killed, "
            "or the machine restarted).",
            hint="Its run stays resumable: call nitro_train with the same experiment and run_dir "
            "and resume='auto'. The log tail shows its last words.",
        )

    # -- stopping ---------------------------------------------------------------------------------
    def stop(self, job_id: str, force: bool = False) -> JobStatus:
        """Graceful: the worker finishes its epoch, validates and checkpoints. ``force``
        kills it now; the run stays resumable with ``resume="auto"``."""
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
                append_event(directory, {"time": now_iso(), "event": "stopped"})
                return cancelled
            status = read_status(directory)  # launched meanwhile: stop the worker instead
        if status.pid is None:  # launching: the worker checks this flag when it starts
            return update_status(directory, stop_requested=True)
        sig = signal.SIGKILL if force else signal.SIGTERM
        try:
            os.killpg(status.pid, sig) if force else os.kill(status.pid, sig)
        except ProcessLookupError:
            return self._refresh(status)
        append_event(directory, {"time": now_iso(), "event": "kill" if force else "stop_requested"})
        if force:
            child = self._children.pop(job_id, None)
            if child is not None:
                child.wait(timeout=10)
            return update_status(
                directory,
                state="stopped",
                phase="killed",
                ended=now_iso(),
                hint="Killed at once; resume the run with nitro_train(resume='auto').",
            )
        return update_status(directory, stop_requested=True)


def _launching(status: JobStatus) -> bool:
    """Claimed by a server that has not recorded the worker's pid yet (a moment, normally)."""
    if status.pid is not None or status.phase != "launching" or status.started is None:
        return False
    started = datetime.fromisoformat(status.started.replace("Z", "+00:00"))
    return (datetime.now(UTC) - started).total_seconds() < 30
