"""``Nitro``: the handle that sets a run up, trains it, validates it and checkpoints it.

Everything is resolved at construction (setup): the experiment's hooks, the data, the
ranking, the checkpoint to resume or load; a refusal is raised there, before any training.
The handle owns its state and the order of the phases; what each phase makes is built by
:mod:`~nitro_core.training.build` from plain values. Its collaborators get what they need
as arguments or through a protocol of its public attributes: evaluation
(:mod:`~nitro_core.training.evaluation`), records (:mod:`~nitro_core.training.snapshot`),
restores (:mod:`~nitro_core.training.restore`), points (:mod:`~nitro_core.training.points`)
and the refusals before training (:mod:`~nitro_core.training.run_refusals`).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nitro_core.experiment import Experiment
from nitro_core.sources import lookup
from nitro_core.state import rng
from nitro_core.store import manifest
from nitro_core.store.manifest import StopReason
from nitro_core.training import build, ranking, run_refusals, setup, snapshot
from nitro_core.training.budget import next_point
from nitro_core.training.evaluation import Evaluator
from nitro_core.training.loop import StepHooks, epoch_length
from nitro_core.training.plan import plan
from nitro_core.training.points import Parts, Resumption, next_epoch, run_epoch
from nitro_core.training.progress import Listener, Progress
from nitro_core.training.restore import BestRestorer, Held, load_weights, restore_full
from nitro_core.training.resume import ResumePoint

log = logging.getLogger(__name__)


class Nitro:
    """A training run of one experiment in one run directory.

    ``resume``: ``False`` (a fresh run), ``"auto"`` (the latest record of the latest run, or
    a fresh run with a warning when there is none), or a source naming a record: resuming a
    run's latest record continues that run, any other record branches into a new run.
    ``weights``: a source whose parameters and layer state start a new run with a fresh
    optimizer (``restore_optimizer=True`` also takes its optimizer state, under a fresh
    schedule; ``load_ema=True`` loads its EMA copy; ``strict=False`` loads by name).
    ``restore_best``: ``True`` ends ``train()`` holding the run's own best checkpoint, an
    ``Average(...)`` its average. ``seed`` defaults to 0; a resume restores the recorded seed.
    ``n.epoch`` is the epoch of the last checkpoint point and ``n.batch`` the batches of it
    consumed when that point was inside the epoch (``Checkpointer(every_steps=N)``), else
    None; a resume from a mid-epoch record continues that epoch at its next batch.
    ``logger``: ``"jsonl"``, ``"tensorboard"`` or a logger instance, used instead of the
    experiment's ``logger()`` hook (None, the default, calls the hook); a resume needs the
    backend its record was written with.
    ``strategy``: under ``torchrun`` (more than one process), ``"auto"`` and ``"ddp"`` train
    with DistributedDataParallel and ``"fsdp"`` with FSDP2 (``fully_shard``); the handle
    joins the process group (initializing it when the script did not), shards the data
    splits across the ranks, reduces metrics over them, and writes records from rank 0
    (:mod:`nitro_core.training.distributed`).
    ``max_steps`` (optimizer steps of the run) and ``time_limit`` (seconds of each
    ``train()``): a budget; the run stops at the last checkpoint point within it, its record
    written with ``stop_reason="budget"`` (:mod:`nitro_core.training.budget`).
    """

    def __init__(
        self,
        experiment: Experiment,
        run_dir: str | Path | None = None,
        seed: int | None = None,
        resume: Any = False,
        weights: Any = None,
        restore_optimizer: bool = False,
        restore_best: Any = False,
        load_ema: bool = False,
        strict: bool = True,
        device: str | torch.device = "auto",
        logger: Any = None,
        strategy: str = "auto",
        max_steps: int | None = None,
        time_limit: float | None = None,
    ) -> None:
        # the experiment and where its run lives; the call's pre-flight, as the gate runs it
        self.experiment, self.checkpointer = experiment, build.check_experiment(experiment)
        where = build.location(experiment, self.checkpointer, run_dir)
        self.plan = plan(
            where, resume=resume, weights=weights, restore_optimizer=restore_optimizer,
            restore_best=restore_best, load_ema=load_ema, strict=strict, seed=seed,
            device=device, max_steps=max_steps, time_limit=time_limit,
        )  # fmt: skip
        self.budget, self.options, entries = self.plan.budget, self.plan.options, self.plan.entries
        # on which device, in which process group
        place = build.place(experiment, where, device, strategy)
        self.store, self.dist, self.device, self.step_settings = place
        self.run_dir = self.store.local  # its records and logs, as this process reads them
        setup.warn_partial_files(self.run_dir)
        build.warn_nothing_to_resume(self.options.resume, self.plan.point, self.run_dir)
        # which record, if any, this handle continues: its seed and run id, or new ones
        point = self.plan.fetched_point()
        self.seed, self.run_id, self.parent = build.name_run(point, seed, experiment, place)
        self.parent_diff = build.resume_lineage(point, experiment)
        # the record loaded, as its run directory names it (on object storage its URL)
        self.checkpoint_source: Path | str | None = (
            lookup.shown_record(self.store, point.path) if point else None
        )
        self.averaged_from: dict[str, Any] | None = None
        # what restore_best left in the model (None: the state the handle trained or loaded)
        self.held: Held | None = None
        # build everything from the seed
        rng.seed_everything(self.seed)
        self._build(place, restoring=point is not None)
        self._start_history(entries, logger)
        # load what was asked for; the RNG state is put back when train() starts
        logger_state = self._load(point, entries)
        # the handle touches none of the run's files until train() holds the run
        self.logger.open(
            self.run_dir, self.run_id, logger_state if point and point.continue_run else None
        )
        self._parts = self._lend_parts(place)

    # -- setup, phase by phase (each phase's parts are built by training.build) ----------
    def _build(self, place: build.Place, restoring: bool = False) -> None:
        """The data, the model and its optimizer and step; the hooks that act over steps and
        points (schedule, EMA, anchor, ranking, stops); evaluation. ``restoring``: a resume
        loads the whole state next."""
        exp = self.experiment
        self.data, self.model, eval_model, self._forward_model, self.optimizer, self.stepper = (
            build.training(exp, place, self.seed, restoring)
        )
        self.scheduler = build.schedule(
            exp, self.optimizer, self.data["train"], place.step_settings
        )
        self.ema, self.anchor = build.trackers(exp, self.model, self.optimizer)
        self.components = build.components(exp, self.data)
        self.ranking, self.early_stopper, self.plateau = build.watchers(
            exp, self.checkpointer, list(self.data), self.optimizer
        )
        self._evaluator = Evaluator(
            exp, self.data, eval_model, self.device, self.step_settings, self.ranking, self.dist
        )

    def _start_history(self, entries: list[manifest.ManifestEntry], logger: Any) -> None:
        """The logger, the counters and history of a fresh handle, the stop flag."""
        self.logger = build.logger(self.experiment, logger, self.dist)
        self.step = 0
        self.epoch = 0
        self.batch: int | None = None  # batches of `epoch` consumed, at a mid-epoch point
        self.history: list[dict[str, Any]] = []
        self.stop_reason: StopReason | None = None
        self._stop = threading.Event()
        self._progress = Progress()
        self._best = BestRestorer(self, self.options.restore_best)
        ranking.warn_about_directory(
            entries, self.checkpointer, self.run_id, self.ranking, self.run_dir
        )

    def _load(
        self, point: ResumePoint | None, entries: list[manifest.ManifestEntry]
    ) -> dict[str, Any] | None:
        """Restore the resumed record, or load the weights asked for; returns the logger's
        recorded state. The generators are put back when train() starts."""
        if point is not None:
            restored = restore_full(self, point)
            self._resumption = Resumption(restored.position, restored.start_rng)
            return restored.logger_state
        if self.options.weights is not None:
            loaded = load_weights(self, self.options.weights, entries)
            self.parent = build.weights_parent(
                self.options.weights, self.checkpoint_source, loaded.run, self.averaged_from
            )
            self.parent_diff = build.weights_lineage(loaded.config, self.experiment)
        self._resumption = Resumption(None, rng.capture())
        return None

    def _lend_parts(self, place: build.Place) -> Parts:
        """What the points of this handle use of it, the record writer among them."""
        writer = build.record_writer(
            self.checkpointer, place, self.run_id, self.ranking.pair, self.parent, self.step
        )
        return Parts(
            self._resumption, self._forward_model, writer, self._progress, self._decide_stop,
            functools.partial(snapshot.take, self),
        )  # fmt: skip

    # -- training -------------------------------------------------------------------------
    def train(
        self,
        on_epoch: Callable[[dict[str, Any]], None] | None = None,
        on_progress: Listener | None = None,
    ) -> Nitro:
        """Train to ``max_epochs`` (or an early stop, or a requested stop); returns self.

        ``on_epoch(row)`` is called after each checkpoint point (each epoch end and, with
        ``Checkpointer(every_steps=N)``, each mid-epoch point, whose row has ``batch``) has
        been validated, logged and checkpointed (an asynchronous write queued), with its
        history row; ``on_progress(snapshot)`` about every two
        seconds while an epoch trains (:class:`~nitro_core.training.progress.Snapshot`)."""
        self._best.refuse_training()
        self._progress.listener = on_progress
        hooks = StepHooks(self.scheduler, self.ema, self.anchor, self._progress)
        hooks.stepper = self.stepper
        hooks.ranks = self.dist.gather if self.dist.active else None  # ranks agree on a NaN
        writer = self._parts.writer
        with setup.run_lock(self.run_dir, self.run_id, self.dist.main) as mine:
            if not mine:
                run_refusals.refuse_held(self.run_dir, self.run_id)
            if self.dist.main:
                run_refusals.refuse_stale_point(
                    self.store.entries(),
                    self.run_dir, self.run_id, self.step, self.epoch,
                )  # fmt: skip
            run_refusals.refuse_spent_budget(
                self.budget, self.run_dir, self.run_id, self.step, self._next_point()
            )  # fmt: skip
            if self.dist.main:  # what killed writes left, before this run writes again
                setup.reclaim_leftovers(self.store)
            self.budget.start(self.step)
            # the first train() starts where setup left off (a mid-epoch resume: once the
            # train split is positioned)
            resumption = self._resumption
            if resumption.start_rng is not None and resumption.position is None:
                rng.restore(*resumption.start_rng)
                resumption.start_rng = None
            self._stop.clear()
            previous = setup.install_sigint(self.request_stop)
            try:
                while next_epoch(self) <= self.experiment.max_epochs:
                    run_epoch(self, self._parts, hooks, on_epoch)
                    if self.stop_reason is not None:
                        break
                if writer is not None:  # no rank returns before rank 0 committed
                    writer.wait("The end of train()")  # the last record, or its error
            except BaseException:
                if writer is not None:  # the write in flight still commits
                    writer.drain(raise_error=False)
                raise
            else:  # returns only once the last record is committed, or raises its error
                if writer is not None:
                    writer.drain()
            finally:
                setup.restore_sigint(previous)
                self.logger.close()  # reopened on the next row, if this handle trains again
        self._best.apply()
        return self

    def close(self) -> None:
        """Release the logger's file (``train()`` does this when it returns) and the process
        group, when this handle made it."""
        self.logger.close()
        self.dist.close()

    def __enter__(self) -> Nitro:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _decide_stop(self, metrics: dict[str, float], next_step: int | None) -> StopReason | None:
        monitor = self.ranking.monitor
        value = metrics.get(monitor[0]) if monitor and metrics else None
        early = False
        requested = self.dist.any(self._stop.is_set())  # every rank stops at the same point
        spent = self.budget.active and self.budget.spent(self.step, next_step)
        budget = self.budget.active and self.dist.any(spent)  # clocks differ
        if value is not None:
            if self.plateau is not None:
                self.plateau.step(value)
            if self.early_stopper is not None:
                early = self.early_stopper.update(value)
        if early:
            return "early_stop"
        if requested:
            return "requested"
        if self.batch is None and self.epoch >= self.experiment.max_epochs:
            return "completed"
        if budget:
            return "budget"
        return None

    def _next_point(self) -> int | None:
        """The step of the first point the next ``train()`` reaches (None: not known)."""
        if self.epoch >= self.experiment.max_epochs and self._resumption.position is None:
            return None  # a completed run trains nothing
        at = self._resumption.position
        total = epoch_length(self.data["train"])
        every = self.checkpointer.every_steps if self.checkpointer is not None else None
        accumulate = self.stepper.accumulate if self.stepper is not None else 1
        done = at.batch if at is not None else (total or 0)
        return next_point(self.step, done, total, accumulate, every)

    def request_stop(self) -> None:
        """Stop at the next checkpoint point (the epoch's end, or with ``every_steps`` the
        next mid-epoch point), once it has been validated and checkpointed."""
        self._stop.set()

    # -- evaluation -----------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Finalized metrics of the ``val`` split."""
        return self._evaluator.split("val")

    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Finalized metrics of ``split`` (the model's current weights)."""
        return self._evaluator.split(split)

    def __repr__(self) -> str:
        return (
            f"Nitro({type(self.experiment).__name__}, run_dir={str(self.store)!r}, "
            f"run_id={self.run_id!r}, epoch={self.epoch}, step={self.step})"
        )


def checkpoint_run(nitro: Nitro) -> str:
    """The run id a handle writes its records under."""
    return nitro.run_id
