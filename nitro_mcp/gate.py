"""The gate: what every tool family shares, and every check made before a job starts.

One ``Gate`` per server holds the root directory, the registered experiments (reloaded when
a module file changes), the job manager and the server's executor defaults. Its methods are
the checks several tools make (an experiment name and its overrides, a run directory or a
source inside the root, a split) and the following of a job (waiting for it, the call that
continues it). A check that fails raises ``NitroError`` with what to send instead. The tool
families in :mod:`nitro_mcp.tools` declare the tools and do the rest.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from nitro_core.errors import ConfigError, NitroError
from nitro_core.experiment import Experiment, config_of
from nitro_core.jobs import JobManager, JobStatus
from nitro_core.jobs.call_models import SlurmOptions
from nitro_core.jobs.files import TERMINAL, JobSpec
from nitro_core.jobs.probe import Question
from nitro_core.registry import Registry, lookup
from nitro_core.sources import lookup as sources
from nitro_core.sources.grammar import Source
from nitro_core.sources.resolve import resolve
from nitro_core.store import manifest, objects
from nitro_core.store.objects import ObjectUrl
from nitro_core.store.place import LocalPlace, ObjectPlace, Place, named_url, on_disk
from nitro_core.store.run import LocalRun, ObjectRun, RunStore
from nitro_mcp import following, models
from nitro_mcp.arguments import coerce_overrides
from nitro_mcp.echo import clip, clip_text
from nitro_mcp.experiments import IMPORT_TIMEOUT_S, ExperimentModules
from nitro_mcp.paths import directory_inside_root, inside_root, shown, under_storage
from nitro_mcp.tool_calls import after_end, after_failure

Progress = Callable[[float, float | None, str | None], Awaitable[None]]
POLL = 0.2
OVERRIDE_MAX = 1000  # characters in the repr of one override value


class Gate:
    """What the tools share over one root directory."""

    def __init__(
        self,
        root: Path,
        max_jobs: int = 2,
        experiment_modules: tuple[str, ...] = (),
        max_eval_jobs: int = 2,
        import_timeout_s: float = IMPORT_TIMEOUT_S,
        executor: str = "local",
        slurm_options: SlurmOptions | None = None,
        warm: bool = False,
        storage: str | None = None,
        any_storage: bool = False,
    ) -> None:
        self.root = Path(root).resolve()
        # object storage: every URL under storage (nitro serve --storage), or any (a CLI's)
        self.storages = (objects.parse(storage, "--storage"),) if storage else ()
        self.any_storage = any_storage
        self._experiments = ExperimentModules(
            self.root, tuple(experiment_modules), import_timeout_s
        )
        self.modules = self._experiments.for_jobs()  # what a worker imports, the same way
        self._registry: Registry | None = None  # imported at the first call that needs it
        # warm: evaluations in one warm worker this gate keeps (a server's; not a CLI's)
        self.jobs = JobManager(self.root, max_jobs=max_jobs, max_eval_jobs=max_eval_jobs, warm=warm)
        self._splits: dict[str, tuple[list[str] | None, Any]] = {}  # name -> splits, monitor
        self.executor = executor  # a call's default executor (nitro serve --executor)
        self.slurm_options = slurm_options  # a slurm call's default options (--slurm-partition)

    @property
    def registry(self) -> Registry:
        """The registered experiments; a module whose file changed is imported again first."""
        registry = self._experiments.registry()
        if registry is not self._registry:  # what was learned from the old classes is stale
            self._registry, self._splits = registry, {}
        return registry

    # -- experiments -------------------------------------------------------------------------
    def experiment_class(self, name: str, overrides: dict[str, Any] | None) -> type[Experiment]:
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

    def check_split(self, experiment: str, split: str) -> None:
        splits = self.experiment_splits(experiment)
        if splits is not None and split not in splits:
            raise ConfigError(
                f"split={clip(split)} is not a split of {experiment}; it has {', '.join(splits)}."
            )

    # -- what only the experiment's code can say, asked in a process of its own -------------
    def ask(
        self, name: str, exp: Experiment | None, *asks: str, keep_for: str | None = None,
        described: tuple[str, ...] = (),
    ) -> dict[str, Any]:  # fmt: skip
        """What ``exp`` (``name``'s class; None: its defaults) answers to ``asks`` (of
        :data:`probe.ASKS`), from a child of the fork server: the server never runs the
        operator's code (DESIGN section 16). A thing it could not answer is None."""
        # the modules that imported here (within the import time limit): one that hangs or
        # fails registers nothing, so the child's names are the same without it
        loaded = {m.module for m in self.registry.modules if m.error is None}
        modules = [
            job for written, job in zip(self._experiments.modules, self.modules, strict=True)
            if written in loaded
        ]  # fmt: skip
        question = Question(
            modules=modules, experiment=name, asks=list(asks), keep_for=keep_for,
            config=None if exp is None else config_of(exp), described=list(described),
        )  # fmt: skip
        return self.jobs.local.ask(question)

    def shapes(self, name: str, exp: Experiment) -> dict[str, list[int]] | None:
        """The leaves of ``exp``'s model and their shapes (built on the meta device in the
        child), or None when the model could not be built that way."""
        shapes = self.ask(name, exp, "shapes").get("shapes")
        return shapes if isinstance(shapes, dict) else None

    def described(self, names: list[str]) -> dict[str, tuple[list[str] | None, Any]]:
        """Each experiment's splits and monitor under its defaults, asked once a registry
        (one child for all those not asked yet)."""
        registry = self.registry
        new = [n for n in names if n not in self._splits and n in registry]
        if new:
            said = self.ask(new[0], None, described=tuple(new)).get("described") or {}
            for n in new:
                facts = said.get(n) or {}
                self._splits[n] = (facts.get("splits"), facts.get("monitor"))
        return {n: self._splits.get(n, (None, None)) for n in names}

    def experiment_splits(self, name: str) -> list[str] | None:
        return self.described([name])[name][0]

    # -- paths and sources -----------------------------------------------------------------
    def run_dir(self, run_dir: str | None, experiment: str) -> Path:
        """A call's run directory inside the root; default ``runs/<experiment>``."""
        default = f"runs/{experiment.rsplit('.', 1)[-1]}"
        return directory_inside_root(self.root, run_dir or default, "run_dir")

    def where(self, run_dir: str, what: str = "run_dir") -> Place:
        """A run directory a call names: a URL under the server's ``--storage``, else a
        directory inside the root."""
        url = self.storage_url(run_dir, what)
        if url is not None:
            return ObjectPlace(url)
        return LocalPlace(directory_inside_root(self.root, run_dir, what))

    def run_store(self, run_dir: str | None, experiment: str) -> RunStore:
        """A call's run directory: under the server's ``--storage`` when it names a URL,
        else inside the root (default ``runs/<experiment>``)."""
        url = self.storage_url(run_dir)
        return ObjectRun(url) if url is not None else LocalRun(self.run_dir(run_dir, experiment))

    def storage_url(self, text: object, what: str = "run_dir") -> ObjectUrl | None:
        """The object-store URL ``text`` names, confined under the server's ``--storage``;
        None when ``text`` is not a URL (a path: checked against the root by the caller)."""
        url = named_url(text, what)
        if url is None or self.any_storage:  # at a terminal every URL named is theirs
            return url
        return under_storage(self.storages, str(text), what)

    def rooted_in(self, source: Source, store: RunStore, keyword: str) -> Source:
        """A path source of a call confined where its run directory ``store`` lies: on
        object storage as :meth:`rooted_at` says, else as :meth:`rooted` does."""
        url = self.storage_url(str(store))
        if url is None:
            return self.rooted(source, store.local, keyword)
        return self.rooted_at(source, url, keyword)

    def rooted_at(self, source: Source, url: ObjectUrl, keyword: str) -> Source:
        """A path source of a call whose run directory is the object-store ``url``: a
        record's name there (kept as it is), a URL under the storage, or a local path
        inside the root (made absolute)."""
        path = source.record_path()
        if source.hf_directory() is not None:
            return self.rooted(source, self.root, keyword)  # a local directory, in the root
        if path is None or not path.strip() or self.storage_url(path, keyword) is not None:
            return source  # a pair, or a record's URL
        if Path(path).is_absolute() or "/" in path.rstrip("/"):
            return source.rooted(lambda p: str(inside_root(self.root, p, keyword)))
        return source  # a record of the run directory, by its name

    def existing_dir(self, run_dir: str) -> Path:
        where = directory_inside_root(self.root, run_dir, "run_dir")
        if not where.is_dir():
            raise ConfigError(
                f"run_dir={clip(run_dir)} does not exist under the server's root; nitro_jobs shows where jobs wrote."
            )
        return where

    def rooted(self, source: Source, run_dir: Path, keyword: str) -> Source:
        """A path source made absolute the way the worker (whose working directory is the
        root) will resolve it: relative to the root, else to run_dir; inside the root only."""
        path = source.record_path() or source.hf_directory()
        if path is None:
            return source  # a pair
        if source.hf_directory() is not None:
            on_disk(
                path,
                f"{keyword}={clip(str(source))}: hf: takes a local Hugging Face model "
                f"directory inside the server's root, not a URL; e.g. {keyword}='hf:models/gpt2'.",
            )
        if self.storage_url(path, keyword) is not None:
            return source  # a record's URL, confined under the storage
        candidates = [
            inside_root(self.root, str(base / path), keyword) for base in (self.root, run_dir)
        ]
        found = next((p for p in candidates if p.exists()), candidates[0])  # a file or record dir
        return source.rooted(lambda _: str(found))  # an hf: directory stays one

    def check_source(self, source: Source, run_dir: Path | str, keyword: str) -> Path | str:
        """Resolve a source against the manifest now, so a call that can never succeed is
        answered at once; the record it names (an average's: its state record). A record on
        object storage (``run_dir`` its run directory's URL, or the source a record's URL)
        is named by its URL, its header read and checked by ranged reads (nothing copied
        down: the job reads what it needs)."""
        url = self.storage_url(str(run_dir)) if isinstance(run_dir, str) else None
        if url is not None:
            rooted_at = self.rooted_at(source, url, keyword)
            if rooted_at.hf_directory() is not None:  # a local directory: no record header
                return sources.resolve_at(rooted_at, ObjectRun(url), copy=False).path
            return sources.header_at(rooted_at, ObjectRun(url))[1]
        run_dir = Path(run_dir)
        rooted = self.rooted(source, run_dir, keyword)
        home, _ = sources.home_of(rooted, LocalRun(run_dir))
        if home != LocalRun(run_dir):  # a record of an object-store run directory, by its URL
            return sources.header_at(rooted, home)[1]
        return resolve(rooted, run_dir, manifest.read_manifest(run_dir)).path

    def named(self, record: Path | str) -> str:
        """A record as a reply names it: a URL as it is, a path relative to the root."""
        return record if isinstance(record, str) else shown(self.root, record) or str(record)

    # -- following a job ---------------------------------------------------------------------
    def handle(
        self, status: JobStatus, experiment: str | None, poll: float, nxt: str
    ) -> models.JobHandle:
        return models.JobHandle(
            job_id=status.job_id, kind=status.kind, state=status.state, experiment=experiment,
            run_dir=shown(self.root, status.run_dir), poll_after_s=poll, next=nxt,
        )  # fmt: skip

    async def wait(
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

    def hint(self, status: JobStatus, spec: JobSpec | None = None) -> str | None:
        """After lost, stopped or failed, the complete call that continues or repeats the
        job (a failure as its worker classified it; a job without one keeps its own hint)."""
        if status.state == "failed" and status.failure is not None:
            spec = spec or self.jobs.spec(status.job_id)
            return after_failure(spec, self.root, status.failure, status.recorded_run)
        if status.state not in ("lost", "stopped"):
            return status.hint
        spec = spec or self.jobs.spec(status.job_id)
        return after_end(spec, self.root, status.state, status.run_id)


def next_step(status: JobStatus, hint: str | None) -> str:
    """A reply's ``next``: how to follow a live job, what to do with an ended one."""
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


def page(cursor: str | None, limit: int) -> tuple[int, int]:
    """The first item and the count of a page (``limit`` is in range: the tool's Field)."""
    if cursor is None:
        return 0, limit
    if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 9):
        raise ConfigError(
            f"cursor={clip(cursor)} is not a cursor; pass the next_cursor of the previous page."
        )
    return int(cursor), limit


def _seen(status: JobStatus) -> tuple[object, ...]:
    """What a progress notification reports on: a change of any of it sends one."""
    at = status.progress.at if status.progress is not None else None
    return status.state, status.epoch, status.phase, at


__all__ = ["Gate", "NitroError", "next_step", "page"]
