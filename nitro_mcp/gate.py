"""The gate: what each MCP tool does, with every check made before a job starts.

Each method validates its arguments completely (experiment name, overrides, every source
string, paths inside the root), raises ``NitroError`` with an actionable message when one
is wrong, and otherwise starts a job or reads files. ``server.py`` turns the methods into
tools and a ``NitroError`` into a ``ToolError`` with the same text.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio

from nitro_core.errors import ConfigError, NitroError
from nitro_core.experiment import Experiment
from nitro_core.info import checkpoint_info
from nitro_core.jobs import JobManager, JobStatus, slurm
from nitro_core.jobs.call_models import AverageCall, SlurmOptions, TrainCall, ValidateCall
from nitro_core.jobs.calls import arguments, train_arguments
from nitro_core.jobs.files import TERMINAL, JobSpec, job_dir, log_tail
from nitro_core.jobs.ranks import process_limit
from nitro_core.policy import retention
from nitro_core.registry import Registry, lookup
from nitro_core.sources.grammar import Average, Pair, PathSource, Source, to_source
from nitro_core.sources.resolve import resolve
from nitro_core.sources.selection import check_keep_holds
from nitro_core.store import manifest
from nitro_core.training.options import check_options
from nitro_core.training.resume import latest_point, resume_from_source
from nitro_core.training.setup import check_seed
from nitro_core.verification import verify
from nitro_mcp import call_checks, catalog, deletion, following, job_cleanup, models, observe
from nitro_mcp.arguments import coerce_overrides, flag_text
from nitro_mcp.echo import clip, clip_text
from nitro_mcp.experiments import IMPORT_TIMEOUT_S, ExperimentModules
from nitro_mcp.experiments import listing as experiments_listing
from nitro_mcp.paths import directory_inside_root, file_in_the_way, inside_root, shown
from nitro_mcp.record_fit import check_record_fits, refuse_non_record
from nitro_mcp.refusals import job_error
from nitro_mcp.replies import fit, shrink
from nitro_mcp.tool_calls import after_end, after_failure

Progress = Callable[[float, float | None, str | None], Awaitable[None]]
POLL = 0.2
OVERRIDE_MAX = 1000  # characters in the repr of one override value
LOG_TAIL = 3000
HEADER_MAX = 6000  # characters of a record's header in a reply (cut by replies.shrink)
AVERAGED_FROM_MAX = 2000  # and of what an average was made of
_BULKY = ("rng", "optimizer", "history", "scheduler", "plateau", "position", "data")


class Gate:
    """Tool implementations over one root directory."""

    def __init__(
        self,
        root: Path,
        max_jobs: int = 2,
        experiment_modules: tuple[str, ...] = (),
        max_eval_jobs: int = 2,
        import_timeout_s: float = IMPORT_TIMEOUT_S,
        executor: str = "local",
        slurm_options: SlurmOptions | None = None,
    ) -> None:
        self.root = Path(root).resolve()
        self._experiments = ExperimentModules(
            self.root, tuple(experiment_modules), import_timeout_s
        )
        self.modules = self._experiments.for_jobs()  # what a worker imports, the same way
        self._registry = self._experiments.registry()
        self.jobs = JobManager(self.root, max_jobs=max_jobs, max_eval_jobs=max_eval_jobs)
        self._splits: dict[str, list[str] | None] = {}
        self.executor = executor  # a call's default executor (nitro serve --executor)
        self.slurm_options = slurm_options  # a slurm call's default options (--slurm-partition)

    @property
    def registry(self) -> Registry:
        """The registered experiments; a module whose file changed is imported again first."""
        registry = self._experiments.registry()
        if registry is not self._registry:  # what was learned from the old classes is stale
            self._registry, self._splits = registry, {}
        return registry

    # -- argument checks ----------------------------------------------------------------------
    def _experiment(self, name: str, overrides: dict[str, Any] | None) -> Experiment:
        return self._class(name, overrides)(**(overrides or {}))  # bad fields: ConfigError

    def _class(self, name: str, overrides: dict[str, Any] | None) -> type[Experiment]:
        """The registered class ``name``, once ``overrides`` is a dict of bounded size; its
        numbers given as strings become numbers, in place (``arguments.coerce_overrides``),
        so the job runs with what was checked."""
        # an unknown name is echoed in the refusal, so cut it first (no registered name is long)
        registry = self.registry
        cls = lookup(registry, name if name in registry else clip_text(name))
        if overrides is not None and not isinstance(overrides, dict):
            raise ConfigError(
                f'overrides={clip(overrides)} must be an object of field -> value, e.g. overrides={{"max_epochs": 3}}.'
            )
        for key, value in (overrides or {}).items():
            if len(key) > 80 or len(repr(value)) > OVERRIDE_MAX:
                raise ConfigError(
                    f"overrides[{clip(key)}]={clip(value)} is too long: a field name is at most 80 "
                    f"characters and a value at most {OVERRIDE_MAX}; nitro_experiments lists "
                    "each experiment's fields."
                )
        if overrides:
            coerce_overrides(cls, overrides)
        return cls

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
        found = next((p for p in candidates if p.exists()), candidates[0])  # a file or record dir
        return replace(source, path=str(found))  # an hf: directory stays one

    def _check_source(self, source: Source, run_dir: Path, keyword: str) -> Path:
        """Resolve a source against the manifest now, so a call that can never succeed is
        answered at once; the record it names (an average's: its state record)."""
        rooted = self._rooted(source, run_dir, keyword)
        return resolve(rooted, run_dir, manifest.read_manifest(run_dir)).path

    # -- nitro_train ------------------------------------------------------------------------------
    def train(self, call: TrainCall, after_running: bool = False) -> models.JobHandle:
        resume = flag_text(call.resume, "resume")
        restore_best = flag_text(call.restore_best, "restore_best")
        experiment, overrides, weights = call.experiment, call.overrides, call.weights
        cls = self._class(experiment, overrides)
        where = self._run_dir(call.run_dir, experiment)
        opts = check_options(
            resume, weights, call.restore_optimizer, restore_best, False, call.strict
        )
        observe.check_logger_name(call.logger)  # tensorboard installed here
        call = call.model_copy(
            update={"run_dir": str(where), "resume": resume, "restore_best": restore_best}
        )
        args = train_arguments(**{**call.model_dump(), "run_dir": shown(self.root, where)})
        busy = call_checks.busy_job(self.jobs, where)
        if busy is not None and not after_running:
            raise call_checks.refuse_busy(busy, args)
        entries = manifest.read_manifest(where)
        point = None
        if opts.resume == "auto" and entries:
            point = latest_point(entries, where)
        elif opts.resume is not None and opts.resume != "auto":
            point = resume_from_source(self._rooted(opts.resume, where, "resume"), where, entries)
            point.check_resumable()
        if point is None:
            exp = cls(**overrides)  # unknown or ill-typed fields raise ConfigError
        else:  # the recorded config, overrides changing Host fields only
            # queued behind a job, the run may have trained on by its start: its worker checks
            exp = call_checks.resume_experiment(
                cls, point, overrides, args, busy is None, self.registry
            )
            point.check_config(exp)
        observe.check_logger(call.logger, point, exp, args)
        if opts.weights is not None:
            found = self._check_source(opts.weights, where, "weights")
            check_record_fits(exp, found, call.strict, shown(self.root, found) or str(found),
                              "nitro_train", args, self.registry)  # fmt: skip
        if isinstance(opts.restore_best, Average):
            check_keep_holds(exp.checkpointer(), opts.restore_best, exp.max_epochs)
        _check_seed(call.seed)
        _check_device(call.device)
        call = self._executor(call)
        if call.executor == "slurm":  # the cluster's nodes, not this machine, bound it
            slurm.check_submittable(call)
        else:
            _check_process_limit(call.nproc, call.device)
        after = busy.job_id if busy is not None else None
        status = self.jobs.submit(call, after=after, experiment_modules=self.modules)
        behind = f"It starts when job {busy.job_id} ends. " if busy is not None else ""
        return self._handle(
            status,
            experiment,
            2.0,
            f"{behind}Follow it with {following.follow_call(status.job_id)}.",
        )

    def _executor(self, call: TrainCall) -> TrainCall:
        """The call with the server's default executor and Slurm options filled in; a
        cluster-only option on a local call is refused."""
        executor = call.executor or self.executor
        if executor == "local" and (call.nodes > 1 or call.slurm is not None):
            raise ConfigError(
                f"{'nodes=' + str(call.nodes) if call.nodes > 1 else 'slurm='} runs on a "
                "cluster: send executor='slurm' with it (nitro serve --executor slurm makes it "
                "the default), or leave it out to train on this machine."
            )
        if executor == "local":  # as sent: a local job's spec and hints name no executor
            return call
        options = call.slurm if call.slurm is not None else self.slurm_options
        return call.model_copy(update={"executor": executor, "slurm": options})

    # -- nitro_validate -----------------------------------------------------------------------------
    async def validate(
        self, call: ValidateCall, wait_s: float, progress: Progress | None
    ) -> models.ValidateResult:
        status, notes = await anyio.to_thread.run_sync(lambda: self._submit_validate(call))
        status = await self._wait(status.job_id, wait_s, progress)
        result = status.result or {}
        return models.ValidateResult(
            job_id=status.job_id, state=status.state, metrics=result.get("metrics"), split=call.split,
            checkpoint=shown(self.root, result.get("checkpoint")),
            averaged_from=shrink(result.get("averaged_from"), AVERAGED_FROM_MAX),
            error=job_error(status), next=_next(status, self._hint(status)),
            warnings=call_checks.warnings_of(notes, result),
        )  # fmt: skip

    def _submit_validate(self, call: ValidateCall) -> tuple[JobStatus, list[str]]:
        experiment, overrides = call.experiment, call.overrides
        cls = self._class(experiment, overrides)
        where = self._run_dir(call.run_dir, experiment)
        opts = check_options(False, call.weights, False, False, call.load_ema, True)
        assert opts.weights is not None  # weights is a string, so it became a source
        rooted = self._rooted(opts.weights, where, "weights")
        exp, notes, path = call_checks.from_record(cls, rooted, where, overrides)  # its config
        call = call.model_copy(update={"run_dir": str(where)})
        args = arguments(ValidateCall, {**call.model_dump(), "run_dir": shown(self.root, where)})
        check_record_fits(exp, path, True, shown(self.root, path) or str(path), "nitro_validate",
                          args, self.registry)  # fmt: skip
        self._check_split(experiment, call.split)
        return self.jobs.submit(call, experiment_modules=self.modules), notes

    # -- average -----------------------------------------------------------------------------------
    async def average(
        self, call: AverageCall, wait_s: float, progress: Progress | None
    ) -> models.AverageResult:
        status, notes = await anyio.to_thread.run_sync(lambda: self._submit_average(call))
        status = await self._wait(status.job_id, wait_s, progress)
        result = status.result or {}
        return models.AverageResult(
            job_id=status.job_id, state=status.state,
            averaged_from=shrink(result.get("averaged_from"), AVERAGED_FROM_MAX),
            saved=shown(self.root, result.get("saved")), metrics=result.get("metrics"), error=job_error(status),
            next=_next(status, self._hint(status)), warnings=call_checks.warnings_of(notes, result),
        )  # fmt: skip

    def _submit_average(self, call: AverageCall) -> tuple[JobStatus, list[str]]:
        run_dir, source, save, experiment = call.run_dir, call.source, call.save, call.experiment
        overrides, split = call.overrides, call.split
        where = directory_inside_root(self.root, run_dir, "run_dir")
        src = to_source(source, "source")
        if not (isinstance(src, Pair) and isinstance(src.pick, Average)):
            raise ConfigError(
                f"source={clip(source)} is not an average; write e.g. source='latest => Average(Last(10))'."
            )
        saved = None
        if save is not None:
            saved = inside_root(self.root, save, "save")
            if saved.suffix != ".safetensors":
                raise ConfigError(
                    f"save={clip(save)} must name a .safetensors file, e.g. save='runs/Classifier/avg10.safetensors'."
                )
            blocker = file_in_the_way(saved.parent)
            if blocker is not None:
                raise ConfigError(
                    f"save={clip(save)} lies under the file {clip(shown(self.root, blocker))}, not a "
                    "directory; give a path in a directory, e.g. save='runs/Classifier/avg10.safetensors'."
                )
            if saved.exists():
                raise ConfigError(
                    f"save={clip(save)} already exists; Nitro never overwrites it. Choose a new name."
                )
        notes: list[str] = []
        if not call.validate_average:
            self._check_source(src, where, "source")
            call_checks.refuse_unused(run_dir, source, overrides, split)
        else:  # the state record's config, the call's overrides on top
            experiment = call_checks.average_experiment(
                experiment, src, where, self.registry, run_dir
            )
            cls = self._class(experiment, overrides)
            exp, notes, path = call_checks.from_record(cls, src, where, overrides)
            args: dict[str, Any] = {
                "run_dir": run_dir,
                "source": source,
                "validate": True,
                "experiment": experiment,
            }
            args.update({"overrides": overrides} if overrides else {})
            args.update({"split": split} if split != "val" else {})
            check_record_fits(exp, path, True, shown(self.root, path) or str(path), "average",
                              args, self.registry)  # fmt: skip
            self._check_split(experiment, split)
        call = call.model_copy(
            update={"run_dir": str(where), "save": str(saved) if saved else None,
                    "experiment": experiment}
        )  # fmt: skip
        return self.jobs.submit(call, experiment_modules=self.modules), notes

    # -- nitro_status, nitro_jobs, nitro_stop ---------------------------------------------------------
    async def status(
        self, job_id: str, wait_s: float, progress: Progress | None, until: str = "change",
        brief: bool = False,
    ) -> models.JobStatusResult:  # fmt: skip
        by_epoch = until == "change"
        status = self.jobs.status(_job_id(job_id))
        if wait_s > 0 and status.state not in TERMINAL:
            status = await self._wait(
                job_id, wait_s, progress, until_change=status if by_epoch else None
            )
        if brief:
            return following.brief(status, _next(status, self._hint(status)))
        return following.bounded(self._status_result(status))

    def list_jobs(
        self, state: str | None, limit: int, cursor: str | None,
        prune_older_than_h: float | None = None, dry_run: bool = True,
    ) -> models.JobsPage:  # fmt: skip
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
        start, limit = _page(cursor, limit)
        pruned = None
        if prune_older_than_h is not None:  # ended jobs' directories, before the listing
            pruned = job_cleanup.prune_jobs(self.jobs, prune_older_than_h, dry_run)
        # the job index: ended jobs from one file, only the live ones read from their own
        page, more = self.jobs.page(state, start, limit)  # type: ignore[arg-type]  # checked above
        jobs = [
            models.JobSummary(
                job_id=s.job_id,
                kind=s.kind,
                state=s.state,
                experiment=s.experiment,
                run_dir=shown(self.root, s.run_dir),
                epoch=s.epoch,
                created=s.created,
            )
            for s in page
        ]
        shown_n = fit(jobs, limit)  # a page stays within the reply budget
        return models.JobsPage(
            jobs=jobs[:shown_n],
            next_cursor=str(start + shown_n) if more or shown_n < len(jobs) else None,
            pruned=pruned,
        )

    def stop(self, job_id: str, force: bool) -> models.StopResult:
        status = self.jobs.stop(_job_id(job_id), force)
        follow = following.follow_call(job_id)
        nxt = f"The epoch finishes, validates and checkpoints first; call {follow} to see it end."
        if force:  # with the call that resumes the run, in the job's own arguments
            hint = self._hint(status)
            nxt = f"Killed. {hint + ' ' if hint else ''}{follow} shows the state."
        return models.StopResult(
            job_id=status.job_id, state=status.state, phase=status.phase, next=nxt
        )

    # -- runs, manifest, checkpoint info, experiments ----------------------------------------------------
    def runs(
        self, run_dir: str | None, limit: int = 20, cursor: str | None = None
    ) -> models.RunsResult:
        if run_dir is None:  # every run directory under the root
            return catalog.run_dirs(self.root, None, limit, cursor)
        where = self._existing_dir(run_dir)
        if not catalog.holds_manifest(where):  # the run directories below it, with a hint
            return catalog.run_dirs(self.root, where, limit, cursor)
        entries = manifest.read_manifest(where)
        start, limit = _page(cursor, limit)
        runs = list(dict.fromkeys(e.run for e in reversed(entries)))  # last written first
        out = [_run_summary(entries, run) for run in runs[start : start + limit]]
        shown_n = fit(out, limit)  # a page stays within the reply budget
        end = start + shown_n
        return models.RunsResult(
            run_dir=shown(self.root, where), runs=out[:shown_n], total=len(runs),
            next_cursor=str(end) if end < len(runs) else None,
        )  # fmt: skip

    def compare(self, sources: list[str]) -> models.CompareResult:
        return catalog.compare(self.root, sources)

    def delete(
        self, run_dir: str, run: str | None, files: list[str] | None, dry_run: bool
    ) -> models.DeleteResult:
        return deletion.delete(self.root, self.jobs, run_dir, run, files, dry_run)

    def export(
        self, source: str, path: str, run_dir: str | None, format: str = "weights",
        dtype: str | None = None, max_shard_size: str = "5GB",
    ) -> models.ExportResult:  # fmt: skip
        if format != "hf" and (dtype is not None or max_shard_size != "5GB"):
            raise ConfigError(
                "dtype and max_shard_size are options of format='hf'; write "
                f"nitro_export(source={clip(source)}, path={clip(path)}, format='hf', ...) or "
                "drop them."
            )
        options = (
            catalog.HFOptions(dtype, max_shard_size, self.registry) if format == "hf" else None
        )
        return catalog.export(self.root, source, path, run_dir, options)

    def manifest_page(self, run_dir: str, limit: int, cursor: str | None) -> models.ManifestPage:
        where = self._existing_dir(run_dir)
        entries = manifest.read_manifest(where)
        start, limit = _page(cursor, limit)
        end = start + fit(entries[start:], limit)  # a page stays within the reply budget
        return models.ManifestPage(
            run_dir=shown(self.root, where), total=len(entries), entries=entries[start:end],
            next_cursor=str(end) if end < len(entries) else None,
        )  # fmt: skip

    def checkpoint_info(self, path: str) -> models.CheckpointInfoResult:
        where = inside_root(self.root, path, "path")
        if not (where.is_file() or (where / "header.json").is_file()):  # or a record directory
            raise ConfigError(
                f"path={clip(path)} is not a file under the server's root; nitro_manifest lists a run's files."
            )
        refuse_non_record(where, clip_text(path), _run_dir_of(self.root, where))
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
        return models.CheckpointInfoResult(
            path=shown(self.root, where), header=shrink(header, HEADER_MAX)
        )

    def verify(self, path: str) -> models.VerifyResult:
        where = inside_root(self.root, path, "path")
        checks = verify(where)
        problems = [c for c in checks if not c.ok]
        kept = fit(problems, 50) if problems else 0
        return models.VerifyResult(
            path=shown(self.root, where), checked=len(checks), ok=not problems,
            problems=problems[:kept], more=len(problems) - kept,
        )  # fmt: skip

    def experiments(self, name: str | None = None) -> models.ExperimentsResult:
        return experiments_listing(self.registry, self._experiment_splits, name)

    # -- helpers ----------------------------------------------------------------------------------
    def _check_split(self, experiment: str, split: str) -> None:
        splits = self._experiment_splits(experiment)
        if splits is not None and split not in splits:
            raise ConfigError(
                f"split={clip(split)} is not a split of {experiment}; it has {', '.join(splits)}."
            )

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
        """Poll the job's files until it ends (or, with ``until_change``, ends an epoch), at
        most ``wait_s`` seconds, sending a progress notification at each change: a new
        epoch, state or phase, and the worker's snapshot inside an epoch (every ~2 s)."""
        deadline = time.monotonic() + wait_s
        status = self.jobs.status(job_id)
        seen = _seen(status)
        sent = 0.0  # notifications never go backwards
        while status.state not in TERMINAL and time.monotonic() < deadline:
            await anyio.sleep(POLL)
            status = self.jobs.status(job_id)
            if _seen(status) != seen:
                seen = _seen(status)
                if progress is not None:
                    done, total, text = following.notification(status)
                    sent = max(sent, done)
                    await progress(sent, total, text)
                if until_change is not None and status.epoch != until_change.epoch:
                    break
        return status

    def _hint(self, status: JobStatus, spec: JobSpec | None = None) -> str | None:
        """After lost, stopped or failed, the complete call that continues or repeats the
        job (a failure as its worker classified it; a job without one keeps its own hint)."""
        if status.state == "failed" and status.failure is not None:
            spec = spec or self.jobs.spec(status.job_id)
            return after_failure(spec, self.root, status.failure, status.recorded_run)
        if status.state not in ("lost", "stopped"):
            return status.hint
        spec = spec or self.jobs.spec(status.job_id)
        return after_end(spec, self.root, status.state, status.run_id)

    def _status_result(self, status: JobStatus) -> models.JobStatusResult:
        spec = self.jobs.spec(status.job_id)
        hint = self._hint(status, spec)
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
            max_epochs=status.max_epochs, step=status.step, progress=following.in_epoch(status),
            last_loss=status.last_loss, last_val=status.last_val,
            kept=kept, error=job_error(status), hint=hint, result=status.result, elapsed_s=_elapsed(status),
            log_tail=log_tail(job_dir(self.root, status.job_id), LOG_TAIL), next=_next(status, hint),
            cluster=_cluster(status),
        )  # fmt: skip


def _cluster(status: JobStatus) -> dict[str, Any] | None:
    """A cluster job's Slurm id and the scheduler's last word on it."""
    if status.executor == "local":
        return None
    engine = status.engine.model_dump() if status.engine is not None else None
    return {"executor": status.executor, "slurm_id": status.slurm_id, "engine": engine}


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
            f"job_id={clip(job_id)} is not a job id; nitro_jobs lists them (e.g. job_id='20261129-072848-63c6e6')."
        )
    return job_id


def _run_summary(entries: list[manifest.ManifestEntry], run: str) -> models.RunSummary:
    mine = manifest.run_entries(entries, run)
    scored = [e for e in mine if e.score is not None]
    best = None
    if scored:
        pick = min if scored[-1].mode == "min" else max
        best = pick(e.score for e in scored if e.score is not None and e.pair == scored[-1].pair)
    return models.RunSummary(
        run=run, checkpoints=len(mine), epochs=[e.epoch for e in mine][-100:],  # nitro_manifest: all
        metric=mine[-1].metric, mode=mine[-1].mode, best_score=best, latest_file=mine[-1].file,
        stop_reason=mine[-1].stop_reason, parent=mine[0].parent,
    )  # fmt: skip


def _page(cursor: str | None, limit: int) -> tuple[int, int]:
    """The first item and the count of a page (``limit`` is in range: the tool's Field)."""
    if cursor is None:
        return 0, limit
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 9):
        raise ConfigError(
            f"cursor={clip(cursor)} is not a cursor; pass the next_cursor of the previous page."
        )
    return int(cursor), limit


def _next(status: JobStatus, hint: str | None) -> str:
    if status.state in ("queued", "running"):
        return f"Call {following.follow_call(status.job_id)}: it returns when the job ends."
    if status.state == "succeeded":
        done = "nitro_runs and nitro_manifest show the run's checkpoints; nitro_validate evaluates one."
        unrestored = [
            w for w in (status.result or {}).get("warnings") or []
            if isinstance(w, str) and w.startswith("restore_best=")
        ]  # fmt: skip
        if status.kind == "train" and unrestored:  # the run ended short of its selection
            return f"Done, but {clip_text(unrestored[0], 600)} {done}"
        return f"Done. {done}"
    return hint or "Read error and log_tail, fix the call, and start again."


def _seen(status: JobStatus) -> tuple[object, ...]:
    """What a progress notification reports on: a change of any of it sends one."""
    at = status.progress.at if status.progress is not None else None
    return status.state, status.epoch, status.phase, at


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


__all__ = ["Gate", "NitroError"]


def _check_process_limit(nproc: int, device: str) -> None:
    """Refuse more ranks than the machine runs side by side (one per GPU, or per CPU)."""
    if nproc == 1:
        return
    limit, what = process_limit(device)
    if nproc > limit:
        raise ConfigError(
            f"nproc={nproc} is more processes than this machine has room for: {what}. Send "
            f"nproc from 1 to {max(limit, 1)}, e.g. nproc={max(limit, 1)}."
        )


def _run_dir_of(root: Path, where: Path) -> str | None:
    """The run directory (one holding a manifest) ``where`` lies in, shown from the root."""
    for parent in where.parents:
        if parent != root and root not in parent.parents:
            return None
        if (parent / "manifest.json").is_file():
            return shown(root, parent)
    return None
