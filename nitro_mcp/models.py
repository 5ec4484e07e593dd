"""Return models of the MCP tools: each tool returns one, so each has an output schema."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from nitro_core.jobs.files import JobKind, JobState, Phase
from nitro_core.store.manifest import ManifestEntry
from nitro_core.verification import Checked


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GroupJob(_Model):
    """One seed's job in a group."""

    job_id: str
    seed: int
    state: JobState
    run_dir: str
    epoch: int
    last_val: dict[str, float | None] = Field(default_factory=dict)


class GroupBrief(_Model):
    """A seed group: one training call run once per seed, followed as one item."""

    group: str
    state: JobState = Field(description="running while any job is live; succeeded when all did.")
    n: int
    counts: dict[str, int] = Field(
        description="Jobs per state, e.g. {'succeeded': 2, 'running': 1}."
    )
    jobs: list[GroupJob]


class JobHandle(_Model):
    """A job that was accepted and is queued or running."""

    job_id: str
    kind: JobKind
    state: JobState
    experiment: str | None
    run_dir: str
    poll_after_s: float = Field(description="Seconds to wait before calling nitro_status.")
    next: str = Field(description="What to call next.")
    duplicate: bool = Field(default=False, description="A retry of request_id.")
    group: GroupBrief | None = None


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


class InEpochProgress(_Model):
    """Inside the epoch in progress (written by the worker about every 2 s)."""

    epoch: int = Field(description="The epoch in progress, from 1.")
    batch: int
    batches: int | None
    loss: float | None = Field(description="Mean train loss over the last few seconds.")
    epoch_eta_s: float | None
    eta_s: float | None = Field(description="Seconds left to max_epochs (estimate).")
    age_s: float = Field(description="Seconds since the worker wrote it.")


class JobStatusResult(_Model):
    """A job's state, progress, result or error, and the run's kept checkpoints. With
    brief=true only job_id, state, epoch, max_epochs, step, progress, last_loss, last_val,
    next (and error, when set) are present."""

    job_id: str
    state: JobState
    epoch: int
    max_epochs: int | None
    step: int
    progress: InEpochProgress | None = None
    last_loss: float | None
    last_val: dict[str, float | None]
    next: str
    kind: JobKind | None = None
    phase: Phase | None = None
    experiment: str | None = None
    run_dir: str | None = None
    run_id: str | None = None
    kept: list[KeptCheckpoint] | None = Field(
        default=None, description="The run's newest kept checkpoints (at most 20)."
    )
    error: str | None = None
    hint: str | None = None
    result: dict[str, Any] | None = None
    elapsed_s: float | None = None
    log_tail: str | None = Field(default=None, description="The end of the worker's log.")
    cluster: dict[str, Any] | None = Field(
        default=None,
        description="executor='slurm': the Slurm job id and what the scheduler last said "
        "(state, source: sacct, or squeue/scontrol without accounting, at, nodes).",
    )
    group: GroupBrief | None = None

    @model_serializer(mode="wrap")
    def _given_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A brief reply leaves the fields it was not given out, instead of sending nulls."""
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if k in self.model_fields_set}


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
    warnings: list[str] = Field(
        default_factory=list,
        description="Each config field that differs from the record's (the call's overrides), "
        "and the job's other warnings.",
    )


class AverageResult(_Model):
    """What was averaged, where it was saved, and the metrics when validate=True."""

    job_id: str
    state: JobState
    averaged_from: dict[str, Any] | None
    saved: str | None
    metrics: dict[str, float | None] | None
    error: str | None
    next: str
    warnings: list[str] = Field(
        default_factory=list,
        description="With validate=true: each config field that differs from the state "
        "record's, and the job's other warnings.",
    )


class JobSummary(_Model):
    job_id: str
    kind: JobKind
    state: JobState
    experiment: str | None
    run_dir: str
    epoch: int
    created: str
    group: str | None = Field(default=None, description="A seed group listed as one item.")
    counts: dict[str, int] | None = Field(default=None, description="A group's jobs per state.")


class PrunedJobs(_Model):
    """Ended job directories removed by prune_older_than_h (with dry_run: to be removed)."""

    dry_run: bool
    jobs: list[str] = Field(description="Job ids, oldest first (at most 50).")
    count: int
    bytes: int
    next: str


class JobsPage(_Model):
    jobs: list[JobSummary]
    next_cursor: str | None = Field(
        description="Pass as cursor for the next page; null at the end."
    )
    pruned: PrunedJobs | None = None


class StopResult(_Model):
    job_id: str
    state: JobState
    phase: Phase | None = Field(description="A job's; null for a group.")
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


class RunDirSummary(_Model):
    """A run directory found under the root."""

    run_dir: str
    runs: list[str] = Field(default_factory=list, description="Run ids (the newest 10).")
    run_count: int = 0
    checkpoints: int = 0
    experiment: str | None = None
    config: str | None = Field(default=None, description="Its latest record's config.")
    metric: str | None = None
    mode: str | None = None
    best_score: float | None = None
    best_run: str | None = None
    last_written: str | None = None
    parent: str | None = Field(default=None, description="Its latest run's.")
    parent_diff: dict[str, list[Any]] | None = None
    bytes: int = Field(description="On disk, logs included.")
    error: str | None = None


class RunsResult(_Model):
    """With run_dir: its runs. Without (or when it holds no manifest): run directories."""

    run_dir: str | None
    runs: list[RunSummary]
    run_dirs: list[RunDirSummary] = Field(default_factory=list)
    total: int | None = None
    next_cursor: str | None = None
    hint: str | None = None


class ManifestPage(_Model):
    run_dir: str
    total: int
    entries: list[ManifestEntry]
    next_cursor: str | None


class CheckpointInfoResult(_Model):
    """A record's header without tensors; bulky parts (RNG, optimizer, history) summarized."""

    path: str
    header: dict[str, Any]


class VerifyResult(_Model):
    """``nitro_verify``: every byte of each record checked against its digests."""

    path: str
    checked: int = Field(description="Record files checked.")
    ok: bool = Field(description="True when every one is intact.")
    problems: list[Checked] = Field(description="The files that are not, within the reply budget.")
    more: int = Field(default=0, description="Problems left out of this reply.")


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


class ExperimentModuleInfo(_Model):
    """A module given with --experiment-module (or an entry point that failed to load)."""

    module: str
    experiments: list[str] = Field(description="The names its classes are registered under.")
    error: str | None = Field(description="Why it failed to import; null when it imported.")
    traceback: list[str] = Field(description="The last lines of the failed import's traceback.")
    next: str | None = Field(description="What to do about the error.")


class ExperimentsResult(_Model):
    experiments: list[ExperimentInfo]
    more: list[str] = Field(description="Experiments not described here, by name.")
    modules: list[ExperimentModuleInfo] = Field(
        description="The operator's experiment modules, failed imports included."
    )
    next: str | None = Field(description="How to see the experiments in 'more'.")


class CompareRun(_Model):
    source: str = Field(description="'<run_dir>:<run id>'.")
    experiment: str | None
    epochs: int
    step: int
    checkpoints: int
    metric: str | None
    mode: str | None
    best_score: float | None
    best_epoch: int | None
    final: dict[str, float | None] = Field(description="The last epoch's metrics.")
    wall_s: float | None
    wall_from: str | None = Field(description="'log', 'record' or 'manifest' (written times).")
    parent: str | None
    parent_diff: dict[str, list[Any]] | None = Field(
        default=None, description="Changed from parent: field -> [old, new]."
    )
    stop_reason: str | None


class MetricSpread(_Model):
    """One metric over a group's runs, and against the baseline's."""

    metric: str
    mean: float | None = Field(description="Of the finite values; null when none is.")
    std: float | None = Field(description="Sample standard deviation (n - 1); null for n = 1.")
    n: int = Field(description="Runs with a finite value.")
    baseline_mean: float | None = None
    baseline_std: float | None = None
    baseline_n: int | None = None
    difference: float | None = Field(default=None, description="mean - baseline_mean.")
    sigmas: float | None = Field(
        default=None, description="difference / baseline_std; null when the baseline has no spread."
    )
    within_noise: bool | None = Field(default=None, description="|sigmas| < 2.")


class GroupComparison(_Model):
    """A group's final records, metric by metric: mean, spread, and the baseline's."""

    group: str
    baseline: str | None
    runs: list[str] = Field(description="The group's runs compared, '<run_dir>:<run id>'.")
    baseline_runs: list[str]
    metrics: list[MetricSpread]
    metrics_omitted: int = Field(
        default=0, description="Metrics past the first 8 (the ranked one first); note weighs all."
    )
    left_out: list[str] = Field(description="Jobs without a record to compare, and why.")
    note: str


class CompareResult(_Model):
    runs: list[CompareRun]
    config_diff: dict[str, list[Any]] = Field(
        description="Plain config fields that differ: field -> its value in each run, in order."
    )
    config_diff_omitted: int
    next: str
    spread: GroupComparison | None = None


class DeletedFile(_Model):
    file: str = Field(description="Relative to run_dir.")
    run: str
    epoch: int | None
    bytes: int


class DeleteResult(_Model):
    """What a deletion removed, or with dry_run would remove."""

    run_dir: str
    dry_run: bool
    files: list[DeletedFile] = Field(description="At most 50; files_total counts them all.")
    files_total: int
    entries: int = Field(description="Manifest entries dropped.")
    runs: list[str] = Field(description="Runs dropped whole (their points and logs too).")
    points: int
    bytes: int
    missing: list[str] = Field(description="Listed records already gone from disk.")
    skipped: list[str] = Field(
        description="Names left in place: a link or directory, or an object the store would not delete."
    )
    next: str


class ExportResult(_Model):
    path: str
    bytes: int
    source_file: str | None
    run: str | None
    epoch: int | None
    step: int | None
    experiment: str | None
    averaged_files: int | None
    next: str


class HistoryResult(_Model):
    """A run's metric history: one row per logged epoch (or step), newest last."""

    run_dir: str
    run: str
    runs: list[str] = Field(description="Runs with a metrics log here, latest last (at most 20).")
    total_rows: int = Field(description="Rows in the run's log.")
    columns: list[str] = Field(description="Names of the row cells; val.<metric> from validation.")
    rows: list[list[float | int | str | None]] = Field(
        description="One list per row, cells in column order; numbers to 5 significant digits."
    )
    next: str = Field(description="How many rows exist and how to see others.")
