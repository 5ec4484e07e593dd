"""The local executor (``executor="local"``, the default): each job a worker process on this
machine, started from Nitro's own queue when a slot of its kind is free.

The queue: at most ``max_jobs`` trainings and, in slots of their own, ``max_eval_jobs``
validations and averages run at once; later ones wait, oldest first, and a job that names
another (``after``) waits for its end (:func:`startable` decides; the job manager's ``pump``
starts what it names, under one lock with every other server and ending worker). Workers
run in their own session, so they outlive the server and a client's disconnect. A running
job whose worker vanished without recording an end is ``lost`` (``stopped`` when a stop had
reached it). Stopping: a queued job is cancelled; a running one gets the ``stop_requested``
flag and SIGTERM (graceful), or SIGKILL to its process group (forced).

A server's executor (``warm=True``) keeps a warm worker for evaluations (validate,
average): a fork server (``python -m nitro_core.jobs.worker --warm``) that imported torch
once and runs each job handed over on its stdin in a child forked for it, one after
another, so a job starts warm and nothing it changes reaches the next. While it runs a job,
or when it cannot take one, a job gets a worker of its own; a job's child killed mid-job
leaves its job ``lost`` as any worker does, and the server forks the next; a fork server
that died is replaced at the next evaluation. It ends when the server does (its stdin
closes; the job in hand finishes first).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nitro_core.errors import UnsafePath
from nitro_core.jobs.files import (
    STORE_NAME,
    TERMINAL,
    JobSpec,
    JobStatus,
    alive,
    job_dir,
    note_event,
    open_log,
    read_spec,
    read_status,
    real_dir,
)
from nitro_core.jobs.probe import Question
from nitro_core.jobs.status import compare_and_set, update_status_if
from nitro_core.store.atomic import Replace
from nitro_core.store.manifest import now_iso

WARM_KINDS = frozenset({"validate", "average"})  # what the warm worker runs
ASK_LIMIT_S = 60.0  # the most a question about an experiment's code is waited for


class LocalExecutor:
    """Worker processes of the jobs under ``root``; ``pump`` starts queued jobs while slots
    are free (after a submit, and after a stop that ended a job)."""

    def __init__(self, root: Path, pump: Callable[[], None], warm: bool = False) -> None:
        self.root = root
        self._pump = pump
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self.warm = warm  # evaluations go to the warm worker when it is free
        self._closed = False  # the server ended: no fork server is started again
        self._warm: subprocess.Popen[bytes] | None = None
        self._warm_job: str | None = None  # the job last handed to it
        self._warm_lock = threading.Lock()  # the server's threads hand jobs over one at a time
        self._probes: Path | None = None  # where questions and answers pass (a private tmp)

    def submit(self, directory: Path, spec: JobSpec) -> None:
        """The job is queued: it starts now if a slot is free, else when one frees."""
        self._pump()

    def launch(self, job_id: str) -> None:
        """Claim the queued job and start its worker; a job another server claimed, or one
        stopped meanwhile, is left alone, and a worker that cannot start fails the job."""
        directory = job_dir(self.root, job_id)
        if (
            update_status_if(
                directory, {"queued"}, state="running", phase="launching", started=now_iso()
            )
            is None
        ):
            return  # another server claimed it, or it was stopped meanwhile
        if self.warm and read_status(directory).kind in WARM_KINDS and self._to_warm(directory):
            return
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

    def _to_warm(self, directory: Path) -> bool:
        """Hand the claimed job to the warm worker when it is free (started first when there
        is none); False when it cannot take it, and a worker of its own runs the job."""
        with self._warm_lock:
            return self._hand_over(directory)

    def _hand_over(self, directory: Path) -> bool:
        worker = self._warm
        if worker is not None and not self._usable(worker):
            self._drop_warm()
            worker = None
        if worker is not None and self._warm_job is not None:
            if _state(self.root, self._warm_job) not in TERMINAL:
                return False  # busy with the job it was last given
        try:
            with open_log(directory):  # a link in its place: the usual start records it
                pass
            worker = worker or self._start_warm()
            assert worker.stdin is not None
            worker.stdin.write(f"{directory}\n".encode())
            worker.stdin.flush()
        except (OSError, ValueError, UnsafePath):  # could not start, died, or the server closed it
            self._drop_warm()
            return False
        self._warm, self._warm_job = worker, directory.name
        compare_and_set(
            directory, lambda s: s.state == "running" and s.pid is None,
            phase="starting", pid=worker.pid,
        )  # fmt: skip
        return True

    def _usable(self, worker: subprocess.Popen[bytes]) -> bool:
        """Whether the warm worker can take a job: its fork server is running (a job's child
        killed or lost leaves the server as it was)."""
        return worker.poll() is None and alive(worker.pid, None)

    def _drop_warm(self) -> None:
        """Forget the warm worker, killed first when it is still there (never two at once)."""
        if self._warm is not None:
            with contextlib.suppress(OSError):
                os.killpg(self._warm.pid, signal.SIGKILL)
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self._warm.wait(timeout=10)
        self._warm, self._warm_job = None, None

    def _start_warm(self) -> subprocess.Popen[bytes]:
        """The fork server, its own lines (between jobs) in ``.nitro/warm.log``; started by a
        question before the root has a job store, on the server's stderr instead (a refused
        call leaves nothing under the root)."""
        store = self.root / STORE_NAME
        if not real_dir(store):
            return self._fork_server(2)  # this process's stderr; never fd 1, the MCP channel
        fd = os.open(store / "warm.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW)
        with os.fdopen(fd, "ab") as log_file:
            return self._fork_server(log_file.fileno())

    def _fork_server(self, log_fd: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-P", "-m", "nitro_core.jobs.worker", "--warm"],
            stdin=subprocess.PIPE, stdout=log_fd, stderr=subprocess.STDOUT, cwd=self.root,
            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip

    def ask(self, question: Question, limit_s: float = ASK_LIMIT_S) -> dict[str, Any]:
        """The answer to a question about an experiment's code (:mod:`nitro_core.jobs.probe`),
        asked in a child of the fork server (also with ``warm=False``, which concerns jobs),
        else (the server closed, or it cannot start) in a process of its own;
        empty when none came within ``limit_s`` (or the process died): the checks that
        needed it are left to the job. The server itself runs none of that code."""
        if self._probes is None:  # private to this server, outside the root: nothing left there
            self._probes = Path(tempfile.mkdtemp(prefix="nitro-probes-"))
        probes = self._probes
        name = uuid.uuid4().hex
        asked, answered = probes / f"{name}.question.json", probes / f"{name}.answer.json"
        body = question.model_dump_json().encode()
        Replace(asked).commit(lambda f: f.write(body))
        line = json.dumps({"question": str(asked), "answer": str(answered)})
        try:
            # the fork server answers questions even where evaluations get a worker of their
            # own (--no-warm-worker): a question is no job, and a process for each is 1.5 s
            process = None if self._closed else self._send(line)
            if process is None:
                process = subprocess.Popen(
                    [sys.executable, "-P", "-m", "nitro_core.jobs.probe", str(asked), str(answered)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, cwd=self.root, start_new_session=True,
                )  # fmt: skip
            deadline = time.monotonic() + limit_s
            while not answered.exists():
                if process.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.005)
            if not answered.exists():
                return {}
            with contextlib.suppress(ValueError):
                said = json.loads(answered.read_bytes())
                return said if isinstance(said, dict) else {}
            return {}
        finally:
            for path in (asked, answered):
                path.unlink(missing_ok=True)

    def _send(self, line: str) -> subprocess.Popen[bytes] | None:
        """Hand ``line`` to the fork server (started first when there is none); None when it
        cannot take it."""
        with self._warm_lock:
            worker = self._warm
            if worker is not None and not self._usable(worker):
                self._drop_warm()
                worker = None
            try:
                worker = worker or self._start_warm()
                assert worker.stdin is not None
                worker.stdin.write(f"{line}\n".encode())
                worker.stdin.flush()
            except (OSError, ValueError):
                self._drop_warm()
                return None
            self._warm = worker
            return worker

    def close(self) -> None:
        """The server ends: the warm worker finishes the job in hand, then ends too."""
        with self._warm_lock:
            self.warm = False  # a pump still in flight starts workers of their own
            self._closed = True
            if self._probes is not None:
                shutil.rmtree(self._probes, ignore_errors=True)
            if self._warm is not None and self._warm.stdin is not None:
                with contextlib.suppress(OSError):
                    self._warm.stdin.close()
            self._warm = None

    def refresh(self, directory: Path, status: JobStatus) -> JobStatus:
        """Reap a finished child; mark a running job whose worker vanished as lost."""
        child = self._children.get(status.job_id)
        if child is not None and child.poll() is not None:
            self._children.pop(status.job_id, None)
        if status.state != "running" or alive(status.pid, status.pid_start) or _launching(status):
            return status
        if self._warm is not None and _ended_child_of(status.pid, self._warm.pid):
            return status  # the fork server is about to record how its job's process ended

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

    def stop(self, directory: Path, status: JobStatus, force: bool) -> JobStatus:
        """Cancel a queued job; ask a running one's worker to stop (SIGTERM, with the flag
        it watches), or kill its process group (``force``)."""
        if status.state == "queued":
            cancelled = update_status_if(
                directory, {"queued"}, state="stopped", phase="cancelled", ended=now_iso()
            )
            if cancelled is not None:
                note_event(directory, {"time": now_iso(), "event": "stopped"})
                self._pump()
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
            return self.refresh(directory, read_status(directory))
        if force and self._warm is not None and flagged.pid == self._warm.pid:
            with self._warm_lock:
                self._drop_warm()  # reaped before the next job could be handed to it
        note_event(directory, {"time": now_iso(), "event": "kill" if force else "stop_requested"})
        if not force:
            return read_status(directory)
        child = self._children.pop(status.job_id, None)
        if child is not None:
            child.wait(timeout=10)
        killed = update_status_if(
            directory, {"running"}, state="stopped", phase="killed", ended=now_iso()
        )  # the MCP layer writes the call that resumes it
        self._pump()
        return killed if killed is not None else read_status(directory)


def _state(root: Path, job_id: str) -> str:
    try:
        return read_status(job_dir(root, job_id)).state
    except (OSError, ValueError):  # gone: nothing holds the warm worker
        return "lost"


def startable(
    statuses: list[JobStatus], max_jobs: int, max_eval_jobs: int, root: Path
) -> list[str]:
    """The queued jobs among ``statuses`` (the local jobs not ended) to start now, oldest
    first, while a slot of their kind is free: fewer than ``max_jobs`` trainings, or fewer
    than ``max_eval_jobs`` validations and averages, running; a job queued behind one that
    has not ended waits."""
    limit = {True: max_jobs, False: max_eval_jobs}  # by "is a training"
    running = {True: 0, False: 0}
    for s in statuses:
        running[s.kind == "train"] += s.state == "running"
    queued = sorted((s for s in statuses if s.state == "queued"), key=lambda s: s.created)
    out = []
    for s in queued:
        train = s.kind == "train"
        if running[train] >= limit[train]:
            continue
        if _waits(root, s.job_id, statuses):  # queued behind a job not yet ended
            continue
        out.append(s.job_id)
        running[train] += 1
    return out


def _waits(root: Path, job_id: str, statuses: list[JobStatus]) -> bool:
    """Whether the queued job names (``after``) a job that is still queued or running."""
    try:
        after = read_spec(job_dir(root, job_id)).after
    except (OSError, ValueError):  # unreadable: it fails on its own when it starts
        return False
    return after is not None and any(
        s.job_id == after and s.state not in TERMINAL for s in statuses
    )


def _ended_child_of(pid: int | None, parent: int) -> bool:
    """Whether ``pid`` is a child of ``parent`` that ended but was not reaped yet (a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] == "Z" and fields[1] == str(parent)


def _launching(status: JobStatus) -> bool:
    """Claimed by a server that has not recorded the worker's pid yet (a moment, normally)."""
    if status.pid is not None or status.phase != "launching" or status.started is None:
        return False
    started = datetime.fromisoformat(status.started.replace("Z", "+00:00"))
    return (datetime.now(UTC) - started).total_seconds() < 30
