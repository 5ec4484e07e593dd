"""A job's files: ``spec.json`` (what to run, written once), ``status.json`` (rewritten
atomically by whoever owns the job's state), ``events.jsonl`` (one line per epoch and
state change) and ``log.txt`` (the worker's stderr and stdout)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nitro_core.store import recordio as store

JobKind = Literal["train", "validate", "average"]
JobState = Literal["queued", "running", "succeeded", "failed", "stopped", "lost"]
Phase = Literal[
    "queued", "launching", "starting", "setup", "loading", "training", "validating", "averaging",
    "done", "failed", "cancelled", "killed", "lost",
]  # fmt: skip
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "stopped", "lost"})


class JobSpec(BaseModel):
    """Everything a worker needs; validated by the server before the job is created."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str
    kind: JobKind
    experiment: str | None = None
    experiment_modules: list[str] = Field(default_factory=list)
    overrides: dict[str, Any] = Field(default_factory=dict)
    run_dir: str
    seed: int | None = None
    resume: str = "false"
    weights: str | None = None
    restore_best: str = "false"
    restore_optimizer: bool = False
    strict: bool = True
    load_ema: bool = False
    split: str = "val"
    source: str | None = None
    save: str | None = None
    validate_average: bool = False
    device: str = "auto"
    max_jobs: int = Field(default=2, ge=0)  # the submitting server's limit, for the worker's pump
    created: str


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
    error: str | None = None
    hint: str | None = None
    result: dict[str, Any] | None = None
    stop_requested: bool = False
    created: str
    started: str | None = None
    ended: str | None = None


def job_dir(root: Path, job_id: str) -> Path:
    return root / ".nitro" / "jobs" / job_id


def write_json(path: Path, model: BaseModel) -> None:
    body = model.model_dump_json(indent=1).encode()
    store.commit(lambda f: f.write(body), path)


def read_spec(directory: Path) -> JobSpec:
    return JobSpec.model_validate_json((directory / "spec.json").read_bytes())


def read_status(directory: Path) -> JobStatus:
    return JobStatus.model_validate_json((directory / "status.json").read_bytes())


def append_event(directory: Path, event: dict[str, Any]) -> None:
    with open(directory / "events.jsonl", "a") as f:
        f.write(json.dumps(event, allow_nan=True) + "\n")


def log_tail(directory: Path, limit: int = 4000) -> str:
    """The last ``limit`` bytes of the job's log, cut at a line start."""
    path = directory / "log.txt"
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return ""
    with open(path, "rb") as f:
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
