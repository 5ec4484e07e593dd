"""The gate: what each MCP tool does, with every check made before a job starts.

Each method validates its arguments completely (experiment name, overrides, every source
string, paths inside the root), raises ``NitroError`` with an actionable message when one
is wrong, and otherwise starts a job or reads files. ``server.py`` turns the methods into
tools and a ``NitroError`` into a ``ToolError`` with the same text.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio

from nitro_core.errors import ConfigError, NitroError
from nitro_core.experiment import Experiment, host_fields
from nitro_core.info import checkpoint_info
from nitro_core.jobs import JobManager, JobStatus
from nitro_core.jobs.files import TERMINAL, job_dir, log_tail
from nitro_core.policy import retention
from nitro_core.registry import load_registry, lookup
from nitro_core.sources.grammar import Average, Pair, PathSource, Source, to_source
from nitro_core.sources.resolve import resolve
from nitro_core.sources.selection import check_keep_holds
from nitro_core.store import manifest
from nitro_core.training.options import check_options
from nitro_core.training.resume import latest_point, resume_from_source
from nitro_core.training.setup import check_seed
from nitro_mcp import models
from nitro_mcp.echo import clip, clip_text
from nitro_mcp.paths import directory_inside_root, file_in_the_way, inside_root, shown

Progress = Callable[[float, float | None, str | None], Awaitable[None]]
POLL = 0.2
OVERRIDE_MAX = 1000  # characters in the repr of one override value
LOG_TAIL = 3000
_BULKY = ("rng", "optimizer", "history", "scheduler", "plateau")


class Gate:
    """Tool implementations over one root directory."""

    def __init__(
        self, root: Path, max_jobs: int = 2, experiment_modules: tuple[str, ...] = ()
    ) -> None:
        self.root = Path(root).resolve()
        self.modules = list(experiment_modules)
        self.registry = load_registry(self.modules)
        self.jobs = JobManager(self.root, max_jobs=max_jobs)
        self._splits: dict[str, list[str] | None] = {}

    # -- argument checks ----------------------------------------------------------------------
    def _experiment(self, name: str, overrides: dict[str, Any] | None) -> Experiment:
        # an unknown name is echoed in the refusal, so cut it first (no registered name is long)
        cls = lookup(self.registry, name if name in self.registry else clip_text(name))
        if overrides is not None and not isinstance(overrides, dict):
            raise ConfigError(
                f'overrides={clip(overrides)} must be an object of field -> value, e.g. {{"max_epochs": 3}}.'
            )
        for key, value in (overrides or {}).items():
            if len(key) > 80 or len(repr(value)) > OVERRIDE_MAX:
                raise ConfigError(
                    f"overrides[{clip(key)}]={clip(value)} is too long: a field name is at most 80 "
                    f"characters and a value at most {OVERRIDE_MAX}; nitro_experiments lists "
                    "each experiment's fields."
                )
        return cls(**(overrides or {}))  # unknown or ill-typed fields raise ConfigError

    def _run_dir(self, run_dir: str | None, experiment: str) -> Path:
        default = f"runs/{experiment.rsplit('.', 1)[-1]}"
        return directory_inside_root(self.root, run_dir or default, "run_dir")

    def _rooted(self, source: Source, run_dir: Path, keyword: str) -> Source:
        """A path source made absolute the way the worker (whose working directory is the
        root) will resolve it: relative to the root, else to run_dir; inside the root only."""
        if not isinstance(source, PathSource):
            return source
        candidates = [
            inside_root(self.root, str(base / source.path), keyword)
            for base in (self.root, run_dir)
        ]
        found = next((p for p in candidates if p.is_file()), candidates[0])
        return PathSource(str(found))

    def _check_source(self, source: Source, run_dir: Path, keyword: str) -> None:
        """Resolve a source against the manifest now, so a call that can never succeed is
        answered at once."""
        resolve(self._rooted(source, run_dir, keyword), run_dir, manifest.read_manifest(run_dir))

    # -- nitro_train ------------------------------------------------------------------------------
    def train(
        self, experiment: str, run_dir: str | None, resume: str, weights: str | None, restore_best: str,
        restore_optimizer: bool, strict: bool, seed: int | None, overrides: dict[str, Any] | None, device: str,
    ) -> models.JobHandle:  # fmt: skip
        exp = self._experiment(experiment, overrides)
        where = self._run_dir(run_dir, experiment)
        opts = check_options(resume, weights, restore_optimizer, restore_best, False, strict)
        entries = manifest.read_manifest(where)
        if opts.resume == "auto" and entries:
            latest_point(entries, where).check_config(exp)
        elif opts.resume is not None and opts.resume != "auto":
            point = resume_from_source(self._rooted(opts.resume, where, "resume"), where, entries)
            point.check_resumable()
            point.check_config(exp)
        if opts.weights is not None:
            self._check_source(opts.weights, where, "weights")
        if isinstance(opts.restore_best, Average):
            check_keep_holds(exp.checkpointer(), opts.restore_best, exp.max_epochs)
        _check_seed(seed)
        _check_device(device)
        status = self.jobs.submit(
            kind="train", experiment=experiment, experiment_modules=self.modules, overrides=overrides or {},
            run_dir=str(where), seed=seed, resume=resume, weights=weights, restore_best=restore_best,
            restore_optimizer=restore_optimizer, strict=strict, device=device,
        )  # fmt: skip
        return self._handle(
            status,
            experiment,
            2.0,
            f"Call nitro_status(job_id='{status.job_id}', wait_s=20) to follow it.",
        )

    # -- nitro_validate -----------------------------------------------------------------------------
    async def validate(
        self, experiment: str, run_dir: str | None, weights: str, split: str, load_ema: bool,
        overrides: dict[str, Any] | None, wait_s: float, progress: Progress | None,
    ) -> models.ValidateResult:  # fmt: skip
        status = await anyio.to_thread.run_sync(
            lambda: self._submit_validate(
                experiment, run_dir, weights, split, load_ema, overrides, wait_s
            )
        )
        status = await self._wait(status.job_id, wait_s, progress)
        result = status.result or {}
        return models.ValidateResult(
            job_id=status.job_id, state=status.state, metrics=result.get("metrics"), split=split,
            checkpoint=shown(self.root, result.get("checkpoint")), averaged_from=result.get("averaged_from"),
            error=status.error, next=_next(status),
        )  # fmt: skip

    def _submit_validate(
        self, experiment: str, run_dir: str | None, weights: str, split: str, load_ema: bool,
        overrides: dict[str, Any] | None, wait_s: float,
    ) -> JobStatus:  # fmt: skip
        self._experiment(experiment, overrides)
        where = self._run_dir(run_dir, experiment)
        _check_wait(wait_s, 60)
        opts = check_options(False, weights, False, False, load_ema, True)
        assert opts.weights is not None  # weights is a string, so it became a source
        self._check_source(opts.weights, where, "weights")
        splits = self._experiment_splits(experiment)
        if splits is not None and split not in splits:
            raise ConfigError(
                f"split={clip(split)} is not a split of {experiment}; it has {', '.join(splits)}."
            )
        return self.jobs.submit(
            kind="validate", experiment=experiment, experiment_modules=self.modules, overrides=overrides or {},
            run_dir=str(where), weights=weights, split=split, load_ema=load_ema,
        )  # fmt: skip

    # -- average -----------------------------------------------------------------------------------
    async def average(
        self, run_dir: str, source: str, save: str | None, experiment: str | None, validate: bool,
        wait_s: float, progress: Progress | None,
    ) -> models.AverageResult:  # fmt: skip
        status = await anyio.to_thread.run_sync(
            lambda: self._submit_average(run_dir, source, save, experiment, validate, wait_s)
        )
        status = await self._wait(status.job_id, wait_s, progress)
        result = status.result or {}
        return models.AverageResult(
            job_id=status.job_id, state=status.state, averaged_from=result.get("averaged_from"),
            saved=shown(self.root, result.get("saved")), metrics=result.get("metrics"), error=status.error,
            next=_next(status),
        )  # fmt: skip

    def _submit_average(
        self, run_dir: str, source: str, save: str | None, experiment: str | None, validate: bool, wait_s: float
    ) -> JobStatus:  # fmt: skip
        where = directory_inside_root(self.root, run_dir, "run_dir")
        _check_wait(wait_s, 60)
        src = to_source(source, "source")
        if not (isinstance(src, Pair) and isinstance(src.pick, Average)):
            raise ConfigError(
                f"source={clip(source)} is not an average; write e.g. 'latest => Average(Last(10))'."
            )
        saved = None
        if save is not None:
            saved = inside_root(self.root, save, "save")
            if saved.suffix != ".safetensors":
                raise ConfigError(
                    f"save={clip(save)} must name a .safetensors file, e.g. 'runs/Classifier/avg10.safetensors'."
                )
            blocker = file_in_the_way(saved.parent)
            if blocker is not None:
                raise ConfigError(
                    f"save={clip(save)} lies under the file {clip(shown(self.root, blocker))}, not a "
                    "directory; give a path in a directory, e.g. 'runs/Classifier/avg10.safetensors'."
                )
            if saved.exists():
                raise ConfigError(
                    f"save={clip(save)} already exists; Nitro never overwrites it. Choose a new name."
                )
        self._check_source(src, where, "source")
        if validate:
            if experiment is None:
                raise ConfigError(
                    "validate=True needs experiment=..., the experiment whose model the average is loaded into."
                )
            self._experiment(experiment, None)
        return self.jobs.submit(
            kind="average", experiment=experiment, experiment_modules=self.modules, run_dir=str(where),
            source=source, save=str(saved) if saved else None, validate_average=validate,
        )  # fmt: skip

    # -- nitro_status, nitro_jobs, nitro_stop ---------------------------------------------------------
    async def status(
        self, job_id: str, wait_s: float, progress: Progress | None
    ) -> models.JobStatusResult:
        _check_wait(wait_s, 25)
        status = self.jobs.status(_job_id(job_id))
        if wait_s > 0 and status.state not in TERMINAL:
            status = await self._wait(job_id, wait_s, progress, until_change=status)
        return self._status_result(status)

    def list_jobs(self, state: str | None, limit: int, cursor: str | None) -> models.JobsPage:
        if state is not None and state not in (
            "queued",
            "running",
            "succeeded",
            "failed",
            "stopped",
            "lost",
        ):
            raise ConfigError(
                f"state={clip(state)} is not a job state; write queued, running, succeeded, failed, stopped or lost."
            )
        start, limit = _page(cursor, limit, 100)
        jobs = self.jobs.list(state)  # type: ignore[arg-type]  # a JobState: checked just above
        page = jobs[start : start + limit]
        experiments = {s.job_id: self._spec_experiment(s.job_id) for s in page}
        return models.JobsPage(
            jobs=[
                models.JobSummary(
                    job_id=s.job_id,
                    kind=s.kind,
                    state=s.state,
                    experiment=experiments[s.job_id],
                    run_dir=shown(self.root, s.run_dir),
                    epoch=s.epoch,
                    created=s.created,
                )  # fmt: skip
                for s in page
            ],
            next_cursor=str(start + limit) if start + limit < len(jobs) else None,
        )

    def stop(self, job_id: str, force: bool) -> models.StopResult:
        status = self.jobs.stop(_job_id(job_id), force)
        follow = f"nitro_status(job_id='{job_id}', wait_s=20)"
        nxt = (
            f"Killed. Resume the run with nitro_train(..., resume='auto'); {follow} shows the state."
            if force
            else f"The epoch finishes, validates and checkpoints first; call {follow} to see it end."
        )
        return models.StopResult(
            job_id=status.job_id, state=status.state, phase=status.phase, next=nxt
        )

    # -- runs, manifest, checkpoint info, experiments ----------------------------------------------------
    def runs(self, run_dir: str) -> models.RunsResult:
        where = self._existing_dir(run_dir)
        entries = manifest.read_manifest(where)
        out = []
        for run in dict.fromkeys(e.run for e in entries):
            mine = manifest.run_entries(entries, run)
            scored = [e for e in mine if e.score is not None]
            best = None
            if scored:
                pick = min if scored[-1].mode == "min" else max
                best = pick(
                    e.score for e in scored if e.score is not None and e.pair == scored[-1].pair
                )
            out.append(
                models.RunSummary(
                    run=run,
                    checkpoints=len(mine),
                    epochs=[e.epoch for e in mine][-100:],  # bounded: nitro_manifest pages the rest
                    metric=mine[-1].metric,
                    mode=mine[-1].mode,
                    best_score=best,
                    latest_file=mine[-1].file,
                    stop_reason=mine[-1].stop_reason,
                    parent=mine[0].parent,
                )  # fmt: skip
            )
        return models.RunsResult(run_dir=shown(self.root, where), runs=out[-50:])

    def manifest_page(self, run_dir: str, limit: int, cursor: str | None) -> models.ManifestPage:
        where = self._existing_dir(run_dir)
        entries = manifest.read_manifest(where)
        start, limit = _page(cursor, limit, 200)
        return models.ManifestPage(
            run_dir=shown(self.root, where), total=len(entries), entries=entries[start : start + limit],
            next_cursor=str(start + limit) if start + limit < len(entries) else None,
        )  # fmt: skip

    def checkpoint_info(self, path: str) -> models.CheckpointInfoResult:
        where = inside_root(self.root, path, "path")
        if not where.is_file():
            raise ConfigError(
                f"path={clip(path)} is not a file under the server's root; nitro_manifest lists a run's files."
            )
        header = checkpoint_info(where)
        for key in _BULKY:
            if header.get(key) is not None:
                header[key] = "(omitted: use `nitro info --full` at a terminal)"
        layout = header.get("layout")
        if isinstance(layout, dict):
            header["layout"] = {
                "params": len(layout.get("params", [])), "buffers": len(layout.get("buffers", [])),
                "groups": [len(g) for g in layout.get("groups", [])],
            }  # fmt: skip
        return models.CheckpointInfoResult(path=shown(self.root, where), header=header)

    def experiments(self) -> models.ExperimentsResult:
        out = []
        for name in sorted(self.registry):
            cls = self.registry[name]
            host = host_fields(cls)
            fields = [
                models.FieldInfo(
                    name=f,
                    type=_type_name(info.annotation),
                    default=_jsonable(info.get_default(call_default_factory=True)),
                    host=f in host,
                )  # fmt: skip
                for f, info in cls.model_fields.items()
            ]
            try:
                monitor = list(cls().monitor())
            except Exception:  # an experiment without defaults for every field
                monitor = None
            out.append(
                models.ExperimentInfo(
                    name=name,
                    description=(cls.__doc__ or "").strip().split("\n\n")[0],
                    fields=fields,
                    splits=self._experiment_splits(name),
                    monitor=monitor,
                )  # fmt: skip
            )
        return models.ExperimentsResult(experiments=out)

    # -- helpers ----------------------------------------------------------------------------------
    def _experiment_splits(self, name: str) -> list[str] | None:
        if name not in self._splits:
            try:
                self._splits[name] = sorted(self.registry[name]().build_data())
            except Exception:  # needs config without defaults, or data that cannot load here
                self._splits[name] = None
        return self._splits[name]

    def _existing_dir(self, run_dir: str) -> Path:
        where = directory_inside_root(self.root, run_dir, "run_dir")
        if not where.is_dir():
            raise ConfigError(
                f"run_dir={clip(run_dir)} does not exist under the server's root; nitro_jobs shows where jobs wrote."
            )
        return where

    def _spec_experiment(self, job_id: str) -> str | None:
        """The job's experiment, or None when its spec cannot be read (listing never fails)."""
        try:
            return self.jobs.spec(job_id).experiment
        except NitroError:
            return None

    def _handle(
        self, status: JobStatus, experiment: str | None, poll: float, nxt: str
    ) -> models.JobHandle:
        return models.JobHandle(
            job_id=status.job_id, kind=status.kind, state=status.state, experiment=experiment,
            run_dir=shown(self.root, status.run_dir), poll_after_s=poll, next=nxt,
        )  # fmt: skip

    async def _wait(
        self,
        job_id: str,
        wait_s: float,
        progress: Progress | None,
        until_change: JobStatus | None = None,
    ) -> JobStatus:
        """Poll the job's files until it ends (or, with ``until_change``, makes progress), at
        most ``wait_s`` seconds, sending a progress notification at each new epoch."""
        deadline = time.monotonic() + wait_s
        status = self.jobs.status(job_id)
        seen = (status.state, status.epoch, status.phase)
        while status.state not in TERMINAL and time.monotonic() < deadline:
            await anyio.sleep(POLL)
            status = self.jobs.status(job_id)
            now = (status.state, status.epoch, status.phase)
            if now != seen:
                seen = now
                if progress is not None:
                    await progress(
                        float(status.epoch),
                        float(status.max_epochs) if status.max_epochs else None,
                        _progress_text(status),
                    )
                if until_change is not None and status.epoch != until_change.epoch:
                    break
        return status

    def _status_result(self, status: JobStatus) -> models.JobStatusResult:
        spec = self.jobs.spec(status.job_id)
        kept = []
        if status.run_id:
            entries = manifest.read_manifest(Path(status.run_dir))
            why = retention.explain(entries, status.run_id)
            kept = [
                models.KeptCheckpoint(
                    file=e.file,
                    kept_by=list(why.get(e.file, ())),
                    epoch=e.epoch,
                    step=e.step,
                    score=e.score,
                    metric=e.metric,
                    stop_reason=e.stop_reason,
                )  # fmt: skip
                for e in manifest.run_entries(entries, status.run_id)
            ][-20:]
        return models.JobStatusResult(
            job_id=status.job_id, kind=status.kind, state=status.state, phase=status.phase, experiment=spec.experiment,
            run_dir=shown(self.root, status.run_dir), run_id=status.run_id, epoch=status.epoch,
            max_epochs=status.max_epochs, step=status.step, last_loss=status.last_loss, last_val=status.last_val,
            kept=kept, error=status.error, hint=status.hint, result=status.result, elapsed_s=_elapsed(status),
            log_tail=log_tail(job_dir(self.root, status.job_id), LOG_TAIL), next=_next(status),
        )  # fmt: skip


def _check_wait(wait_s: float, most: float) -> None:
    if not 0 <= wait_s <= most:
        raise ConfigError(f"wait_s={wait_s:g} is out of range; give 0 to {most:g} seconds.")


def _check_seed(seed: int | None) -> None:
    if isinstance(seed, int) and seed.bit_length() > 64:  # too long to echo whole, or to repr
        raise ConfigError(
            f"seed={clip(seed)} is not a seed; write an integer from 0 to 2**63 - 1, e.g. seed=0."
        )
    check_seed(seed)


def _check_device(device: str) -> None:
    """'auto', 'cpu', 'cuda' or 'cuda:N' for a device this machine has, refused at the call
    rather than by torch in the worker."""
    from nitro_core.training.setup import resolve_device  # lazy: wiring imports torch

    resolve_device(clip_text(device) if isinstance(device, str) else device)


def _job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not job_id.replace("-", "").isalnum() or len(job_id) > 64:
        raise ConfigError(
            f"job_id={clip(job_id)} is not a job id; nitro_jobs lists them (e.g. '20261129-072848-63c6e6')."
        )
    return job_id


def _page(cursor: str | None, limit: int, most: int) -> tuple[int, int]:
    if not 1 <= limit <= most:
        raise ConfigError(f"limit={clip(limit)} is out of range; give 1 to {most}.")
    if cursor is None:
        return 0, limit
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 9):
        raise ConfigError(
            f"cursor={clip(cursor)} is not a cursor; pass the next_cursor of the previous page."
        )
    return int(cursor), limit


def _next(status: JobStatus) -> str:
    if status.state in ("queued", "running"):
        return f"Call nitro_status(job_id='{status.job_id}', wait_s=20) until it ends."
    if status.state == "succeeded":
        return "Done. nitro_runs and nitro_manifest show the run's checkpoints; nitro_validate evaluates one."
    if status.state == "failed":
        return status.hint or "Read error and log_tail, fix the call, and start again."
    return "The run stays resumable: nitro_train(..., resume='auto') continues it."


def _progress_text(status: JobStatus) -> str:
    val = ", ".join(f"{k}={v:.4g}" for k, v in status.last_val.items() if v is not None)
    return f"{status.state}/{status.phase}: epoch {status.epoch}/{status.max_epochs or '?'} step {status.step} {val}".strip()


def _elapsed(status: JobStatus) -> float | None:
    if status.started is None:
        return None
    start = datetime.fromisoformat(status.started.replace("Z", "+00:00"))
    end = (
        datetime.fromisoformat(status.ended.replace("Z", "+00:00"))
        if status.ended
        else datetime.now(start.tzinfo)
    )
    return round((end - start).total_seconds(), 2)


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _jsonable(value: Any) -> Any:
    return (
        value
        if isinstance(value, str | int | float | bool | type(None) | list | dict)
        else repr(value)
    )


__all__ = ["Gate", "NitroError"]
