"""A job's files: ``spec.json`` (what to run, written once), ``status.json`` (rewritten
atomically by whoever owns the job's state), ``events.jsonl`` (one line per epoch and
state change) and ``log.txt`` (the worker's stderr and stdout).

The job store ``<root>/.nitro/jobs/<job_id>/`` holds real directories only: a link at
``.nitro``, ``.nitro/jobs`` or a job's directory is refused (:class:`UnsafePath`) before
anything is read or written through it, and every file of a job is opened without following
a link (``O_NOFOLLOW``), so a link planted in the store never leads a read or a write out of
the root."""

from __future__ import annotations

import json
import logging
import os
import stat
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nitro_core.errors import UnsafePath
from nitro_core.jobs.call_models import CALLS, Call
from nitro_core.store.atomic import Replace
from nitro_core.store.safeio import flocked, open_nofollow, read_capped

M = TypeVar("M", bound=BaseModel)
JobKind = Literal["train", "validate", "average"]
JobState = Literal["queued", "running", "succeeded", "failed", "stopped", "lost"]
# why a job failed: a non-finite loss or monitor, a record that did not read back, a Nitro
# error (which says what to change), anything else
Failure = Literal["diverged", "corrupt", "refused", "unexpected"]
Phase = Literal[
    "queued", "launching", "starting", "setup", "loading", "training", "validating", "averaging",
    "done", "failed", "cancelled", "killed", "lost",
]  # fmt: skip
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "stopped", "lost"})


# The flat ``spec.json`` of Nitro before the call models: the call's fields beside the job's
# bookkeeping, every field written, those a kind never takes at these defaults. Jobs survive
# a server restart, and an upgrade is one, so that format keeps reading.
_BOOKKEEPING = frozenset(
    {"job_id", "kind", "experiment_modules", "after", "max_jobs", "max_eval_jobs", "created"}
)
_FLAT_DEFAULTS: dict[str, Any] = {
    "experiment": None, "overrides": {}, "seed": None, "resume": "false", "weights": None,
    "restore_best": "false", "restore_optimizer": False, "strict": True, "load_ema": False,
    "split": "val", "source": None, "save": None, "validate_average": False, "device": "auto",
    "nproc": 1, "strategy": "auto", "logger": None,
}  # fmt: skip


def from_flat(data: dict[str, Any]) -> dict[str, Any]:
    """A flat spec (no ``call``) as a spec of today: each field the call model of its
    ``kind`` has moves into ``call``; one it lacks is dropped when at its flat default (the
    old server wrote every field), and else left beside, where it is refused by name."""
    model = CALLS.get(data.get("kind"))  # type: ignore[arg-type]
    if model is None:
        return data  # refused by the kind's Literal
    fields = {info.alias or name for name, info in model.model_fields.items()} | set(
        model.model_fields
    )
    spec: dict[str, Any] = {"call": {}}
    for key, value in data.items():
        if key in _BOOKKEEPING:
            spec[key] = value
        elif key in fields:
            spec["call"][key] = value
        elif key not in _FLAT_DEFAULTS or value != _FLAT_DEFAULTS[key]:
            spec[key] = value
    return spec


class JobSpec(BaseModel):
    """Everything a worker needs: the call (validated by the server before the job is
    created) and the job's bookkeeping."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str
    kind: JobKind
    call: Call  # a TrainCall, ValidateCall or AverageCall, as ``kind`` says
    experiment_modules: list[str] = Field(default_factory=list)  # what the worker imports
    after: str | None = None  # a job this one waits for: it stays queued until that one ends
    max_jobs: int = Field(default=2, ge=0)  # the submitting server's limit, for the worker's pump
    max_eval_jobs: int = Field(default=2, ge=0)  # its limit on validate and average jobs
    created: str
    group: str | None = None  # the seed group it is one job of (jobs.groups)

    @model_validator(mode="before")
    @classmethod
    def _call_of_its_kind(cls, data: Any) -> Any:
        """Read ``call`` as the model ``kind`` names (a union would guess among them); a
        ``spec.json`` of the flat format is read as :func:`from_flat` says."""
        if isinstance(data, dict) and "call" not in data:
            data = from_flat(data)
        if isinstance(data, dict) and isinstance(data.get("call"), dict):
            model = CALLS.get(data.get("kind"))  # type: ignore[arg-type]
            if model is not None:
                data = {**data, "call": model.model_validate(data["call"])}
        return data

    @model_validator(mode="after")
    def _kind_matches(self) -> JobSpec:
        if self.call.kind != self.kind:
            raise ValueError(f"a {self.kind} job's call is a {type(self.call).__name__}")
        return self

    @property
    def experiment(self) -> str | None:
        return self.call.experiment

    @property
    def run_dir(self) -> str:
        """The call's run directory, resolved by the server (a spec always names one)."""
        assert self.call.run_dir is not None
        return self.call.run_dir

    @property
    def nproc(self) -> int:
        """The processes the job runs on (a training's ``nproc``; 1 otherwise)."""
        return getattr(self.call, "nproc", 1)


class EpochProgress(BaseModel):
    """Where the epoch in progress stands (the worker writes it about every two seconds)."""

    model_config = ConfigDict(extra="forbid")

    epoch: int  # the epoch in progress, counted from 1
    batch: int  # its batches done
    batches: int | None  # its batch count, when known
    loss: float | None  # mean training loss over the last few seconds of steps
    epoch_eta_s: float | None  # seconds left in this epoch's training steps
    eta_s: float | None  # seconds left to max_epochs
    at: float  # the Unix time it was taken


class EngineReport(BaseModel):
    """What a cluster's scheduler last said of a job: its own state word (None: it knows
    the job no more), which command answered, when, and on which nodes."""

    model_config = ConfigDict(extra="forbid")

    state: str | None
    source: Literal["sacct", "squeue", "scontrol"]
    at: float
    nodes: str | None = None


class JobStatus(BaseModel):
    """The job's state as its files say."""

    model_config = ConfigDict(extra="forbid")

    job_id: str
    kind: JobKind
    state: JobState
    phase: Phase = "queued"
    pid: int | None = None
    pid_start: str | None = None
    run_dir: str
    run_id: str | None = None
    epoch: int = 0
    max_epochs: int | None = None
    step: int = 0
    last_loss: float | None = None
    last_val: dict[str, float | None] = Field(default_factory=dict)  # NaN/inf are stored as null
    progress: EpochProgress | None = None  # inside the epoch in progress
    error: str | None = None  # as Python writes it (str of the exception)
    refusal: list[Any] | None = None  # a Nitro error's parts (errors.parts_to_json)
    failure: Failure | None = None  # a failed job's kind of failure
    recorded_run: str | None = None  # a failed job's run, when it wrote a record
    hint: str | None = None
    result: dict[str, Any] | None = None
    stop_requested: bool = False
    executor: Literal["local", "slurm"] = "local"  # what runs the job (jobs.slurm)
    slurm_id: str | None = None  # its Slurm job id, once submitted
    engine: EngineReport | None = None  # what the engine last said of it
    created: str
    started: str | None = None
    ended: str | None = None


log = logging.getLogger(__name__)

STORE_NAME = ".nitro"
WHERE = "its job store"  # for safeio's link refusal


def job_dir(root: Path, job_id: str) -> Path:
    return root / STORE_NAME / "jobs" / job_id


def store_link_refusal(path: Path) -> UnsafePath:
    return UnsafePath(
        f"Refusing to use {str(path)!r}: it is a symbolic link, and Nitro keeps its job store "
        "only in real directories under the root (a link could lead outside it). Remove the "
        "link, or replace it by a real directory."
    )


def real_dir(path: Path) -> bool:
    """Whether ``path`` is a directory (False when missing or a file); a link is refused."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    if stat.S_ISLNK(mode):
        raise store_link_refusal(path)
    return stat.S_ISDIR(mode)


def checked(directory: Path) -> Path:
    """A job's directory, once neither it nor ``jobs/`` nor ``.nitro/`` above it is a link."""
    for d in (directory.parent.parent, directory.parent, directory):
        if os.path.islink(d):
            raise store_link_refusal(d)
    return directory


def _open(directory: Path, name: str, flags: int) -> int:
    return open_nofollow(checked(directory) / name, flags, where=WHERE)


def _read_bytes(directory: Path, name: str) -> bytes:
    # O_NONBLOCK: a FIFO planted under the name is read as empty instead of hanging
    with os.fdopen(_open(directory, name, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        return read_capped(f, "job file", str(directory / name))


def write_json(path: Path, model: BaseModel) -> None:
    body = model.model_dump_json(indent=1).encode()
    checked(path.parent)
    Replace(path).commit(lambda f: f.write(body))  # a .tmp never followed, renamed over a link


def read_model(directory: Path, name: str, model: type[M]) -> M:
    """The file ``name`` of a store directory, as ``model`` (``ValueError`` if it is not)."""
    return model.model_validate_json(_read_bytes(directory, name))


def read_spec(directory: Path) -> JobSpec:
    return JobSpec.model_validate_json(_read_bytes(directory, "spec.json"))


def read_status(directory: Path) -> JobStatus:
    return JobStatus.model_validate_json(_read_bytes(directory, "status.json"))


def append_event(directory: Path, event: dict[str, Any]) -> None:
    fd = _open(directory, "events.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    with os.fdopen(fd, "a") as f:
        f.write(json.dumps(event, allow_nan=True) + "\n")


def note_event(directory: Path, event: dict[str, Any]) -> None:
    """``append_event`` for a change ``status.json`` holds already: a link at
    ``events.jsonl`` is refused (nothing is written through it) and logged, and the caller
    goes on, so one planted link never breaks listing or stopping the other jobs."""
    try:
        append_event(directory, event)
    except UnsafePath as exc:
        log.warning(
            "the %s event of job %s is not recorded: %s", event.get("event"), directory.name, exc
        )


def open_log(directory: Path) -> IO[bytes]:
    """The job's log, opened for appending (the worker's stdout and stderr)."""
    return os.fdopen(_open(directory, "log.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")


def locked(directory: Path, name: str) -> AbstractContextManager[bool]:
    """Hold the lock file ``name`` of a job's directory (or of ``.nitro``) for the block."""
    return flocked(checked(directory) / name, where=WHERE)


def log_tail(directory: Path, limit: int = 4000) -> str:
    """The last ``limit`` bytes of the job's log, cut at a line start."""
    try:
        fd = _open(directory, "log.txt", os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return ""
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return ""  # a directory or a FIFO in its place: no log to show
        size = st.st_size
        f.seek(max(0, size - limit))
        data = f.read()
    text = data.decode(errors="replace")
    if size > limit and "\n" in text:
        text = text[text.index("\n") + 1 :]
    return text


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a live worker from a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (FileNotFoundError, IndexError, PermissionError):
        return None


def alive(pid: int | None, start: str | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if start is not None and process_start(pid) not in (None, start):
        return False
    return _not_zombie(pid)


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return True
