"""Return models of the MCP tools: each tool returns one, so each has an output schema."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nitro_core.jobs.files import JobKind, JobState, Phase
from nitro_core.store.manifest import ManifestEntry


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobHandle(_Model):
    """A job that was accepted and is queued or running."""

    job_id: str
    kind: JobKind
    state: JobState
    experiment: str | None
    run_dir: str
    poll_after_s: float = Field(description="Seconds to wait before calling nitro_status.")
    next: str = Field(description="What to call next.")


class KeptCheckpoint(_Model):
    file: str
    kept_by: list[str] = Field(
        description="The selectors that keep it, e.g. 'Best(3): #1 by acc (max)'."
    )
    epoch: int
    step: int
    score: float | None
    metric: str | None
    stop_reason: str | None


class JobStatusResult(_Model):
    """A job's state, progress, result or error, and the run's kept checkpoints."""

    job_id: str
    kind: JobKind
    state: JobState
    phase: Phase
    experiment: str | None
    run_dir: str
    run_id: str | None
    epoch: int
    max_epochs: int | None
    step: int
    last_loss: float | None
    last_val: dict[str, float | None]
    kept: list[KeptCheckpoint] = Field(
        description="The run's checkpoints from its manifest (at most 20, newest last)."
    )
    error: str | None
    hint: str | None
    result: dict[str, Any] | None
    elapsed_s: float | None
    log_tail: str = Field(description="The last few kB of the worker's log.")
    next: str


class ValidateResult(_Model):
    """Validation metrics when the job finished within wait_s; otherwise the job handle."""

    job_id: str
    state: JobState
    metrics: dict[str, float | None] | None
    split: str
    checkpoint: str | None
    averaged_from: dict[str, Any] | None
    error: str | None
    next: str


class AverageResult(_Model):
    """What was averaged, where it was saved, and the metrics when validate=True."""

    job_id: str
    state: JobState
    averaged_from: dict[str, Any] | None
    saved: str | None
    metrics: dict[str, float | None] | None
    error: str | None
    next: str


class JobSummary(_Model):
    job_id: str
    kind: JobKind
    state: JobState
    experiment: str | None
    run_dir: str
    epoch: int
    created: str


class JobsPage(_Model):
    jobs: list[JobSummary]
    next_cursor: str | None = Field(
        description="Pass as cursor for the next page; null at the end."
    )


class StopResult(_Model):
    job_id: str
    state: JobState
    phase: Phase
    next: str


class RunSummary(_Model):
    run: str
    checkpoints: int
    epochs: list[int]
    metric: str | None
    mode: str | None
    best_score: float | None
    latest_file: str
    stop_reason: str | None
    parent: str | None


class RunsResult(_Model):
    run_dir: str
    runs: list[RunSummary]


class ManifestPage(_Model):
    run_dir: str
    total: int
    entries: list[ManifestEntry]
    next_cursor: str | None


class CheckpointInfoResult(_Model):
    """A record's header without tensors; bulky parts (RNG, optimizer, history) summarized."""

    path: str
    header: dict[str, Any]


class FieldInfo(_Model):
    name: str
    type: str
    default: Any
    host: bool = Field(description="True: may change between a run and its resume.")


class ExperimentInfo(_Model):
    name: str
    description: str
    fields: list[FieldInfo]
    splits: list[str] | None
    monitor: list[str] | None


class ExperimentsResult(_Model):
    experiments: list[ExperimentInfo]
