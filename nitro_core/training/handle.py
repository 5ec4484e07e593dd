"""``Nitro``: the handle that sets a run up, trains it, validates it and checkpoints it.

Everything is resolved at construction (setup): the experiment's hooks, the data, the
ranking, the checkpoint to resume or load; a refusal is raised there, before any training.
"""

from __future__ import annotations

import logging
import secrets
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nitro_core.errors import CheckpointerFix, ConfigError, NitroWarning, TrainingRefused
from nitro_core.experiment import Experiment, check_required_hooks, config_of, host_fields
from nitro_core.policy.selectors import Checkpointer
from nitro_core.sources.grammar import HF_PREFIX, Average, HFDirectory, Pair
from nitro_core.state import records, rng
from nitro_core.state.anchor import W0Anchor
from nitro_core.state.ema import EMA, EMATracker
from nitro_core.store import manifest
from nitro_core.store import recordio as store
from nitro_core.store.manifest import StopReason
from nitro_core.training import distributed, ranking, setup, sharding
from nitro_core.training.budget import Budget, check_budget
from nitro_core.training.checkpointing import OneFile, RecordWriter
from nitro_core.training.loggers import MutedLogger, choose_logger
from nitro_core.training.loop import StepHooks, evaluate
from nitro_core.training.options import check_options
from nitro_core.training.points import Parts, Resumption, next_epoch, run_epoch
from nitro_core.training.progress import Listener, Progress
from nitro_core.training.restore import BestRestorer, load_weights, restore_full
from nitro_core.training.resume import ResumePoint, latest_point, resume_from_source
from nitro_core.training.sharded_save import RecordDirectory
from nitro_core.training.step import Stepper, autocast, split_compiled, step_settings
from nitro_core.training.stopping import EarlyStopper, EarlyStopping, Plateau

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
        check_budget(max_steps, time_limit)
        self.budget = Budget(max_steps, time_limit)
        self._check_experiment(experiment)
        self._join(run_dir, device, strategy)
        self.options = check_options(
            resume, weights, restore_optimizer, restore_best, load_ema, strict
        )
        entries = manifest.read_manifest(self.run_dir)
        setup.warn_partial_files(self.run_dir)
        # which record, if any, this handle continues
        point = self._resume_point(entries)
        self._name_run(point, seed)
        # build everything from the seed
        rng.seed_everything(self.seed)
        self._build_model()
        self._build_schedules()
        self._start_history(entries, logger)
        # load what was asked for; the RNG state is put back when train() starts
        logger_state = self._load(point, entries)
        # the handle touches none of the run's files until train() holds the run
        self.logger.open(
            self.run_dir, self.run_id, logger_state if point and point.continue_run else None
        )
        self._parts = self._lend_parts()

    # -- setup, phase by phase ------------------------------------------------------------
    def _check_experiment(self, experiment: Experiment) -> None:
        """The experiment and its checkpointer hook."""
        if not isinstance(experiment, Experiment):
            raise ConfigError(
                f"Nitro(experiment=...) got {type(experiment).__name__}; pass an instance of an "
                "Experiment subclass, e.g. Nitro(Regression(hidden=64))."
            )
        check_required_hooks(experiment)
        self.experiment = experiment
        ckpt = experiment.checkpointer()
        if ckpt is not None and not isinstance(ckpt, Checkpointer):
            raise ConfigError(
                f"{type(experiment).__name__}.checkpointer() returned {ckpt!r}; return ",
                CheckpointerFix("keep=..."),
                " or None.",
            )
        self.checkpointer: Checkpointer | None = ckpt

    def _join(self, run_dir: str | Path | None, device: str | torch.device, strategy: str) -> None:
        """Where the run lives, on which device, in which process group."""
        name = type(self.experiment).__name__
        self.run_dir = setup.resolve_run_dir(run_dir, self.checkpointer, name)
        chosen = setup.resolve_device(device)
        # "auto" and "cuda" leave the GPU to the rank (cuda:LOCAL_RANK); "cuda:1" pins it
        self.dist, self.device = distributed.join(
            strategy, chosen, requested=chosen.index is not None
        )
        self.step_settings = step_settings(self.experiment, self.device)

    def _name_run(self, point: ResumePoint | None, seed: int | None) -> None:
        """The seed and the run id: a resumed record's, or new ones."""
        if point is not None:
            seed = self._check_resumable(point, seed)
        self.seed = setup.check_seed(seed)
        # every rank writes under rank 0's id
        self.run_id = self.dist.broadcast(
            point.continue_run if point and point.continue_run else secrets.token_hex(4)
        )
        self.parent = point.parent if point else None
        self.checkpoint_source: Path | None = point.path if point else None
        self.averaged_from: dict[str, Any] | None = None
        if point is not None and point.continue_run is None:
            warnings.warn(
                f"Resuming {point.file!r} (epoch {point.meta['epoch']} of run "
                f"{point.meta.get('run')}), which is not its run's latest record in "
                f"{str(self.run_dir)!r}: this branches into a new run {self.run_id} with parent "
                f"{self.parent}; the original run's later epochs stay untouched.",
                NitroWarning,
                stacklevel=3,
            )

    def _check_resumable(self, point: ResumePoint, seed: int | None) -> int:
        """Refuse a resume that could not be exact; returns the recorded seed."""
        point.check_resumable()
        point.check_config(self.experiment)
        point.check_step(self.experiment, self.step_settings)
        if seed is not None and seed != point.seed:
            warnings.warn(
                f"seed={seed} ignored: resuming {point.file!r} restores its recorded seed "
                f"{point.seed}. Drop the seed keyword, or start a new run_dir to use seed={seed}.",
                NitroWarning,
                stacklevel=4,
            )
        point.check_environment(torch.get_num_threads(), self.device)
        return point.seed

    def _build_model(self) -> None:
        """The data splits (each rank's share), the model and its optimizer and step."""
        experiment = self.experiment
        self.data = sharding.shard_splits(
            setup.build_splits(experiment), self.dist, self.seed, type(experiment).__name__
        )
        # records go through the uncompiled module; forward passes through the compiled one,
        # and training's through DDP when there is one (evaluation bypasses it: it syncs
        # nothing, and ranks may evaluate unequal shares)
        model = distributed.shard_model(experiment.build_model().to(self.device), self.dist)
        self.model, self._eval_model = split_compiled(model, self.step_settings.compile)
        self._forward_model = distributed.wrap(self.model, self._eval_model, self.dist)
        self.optimizer = experiment.build_optimizer(self.model)
        self.stepper = (
            None
            if self.step_settings.plain
            else Stepper(self.step_settings, self.optimizer, self.device)
        )

    def _build_schedules(self) -> None:
        """The hooks that act over steps and points: schedule, EMA, anchor, ranking, stops."""
        experiment, name = self.experiment, type(self.experiment).__name__
        train = self.data["train"]
        steps = (
            experiment.max_epochs * self.step_settings.steps_per_epoch(len(train))
            if hasattr(train, "__len__")
            else None
        )
        self.scheduler = experiment.lr_scheduler(self.optimizer, steps)
        ema = experiment.ema()
        setup.check_kind(name, "ema", ema, EMA)
        self.ema = EMATracker(self.model, ema.decay) if ema is not None else None
        anchor = experiment.decay_anchor()
        if anchor not in ("zero", "w0"):
            raise ConfigError(f"{name}.decay_anchor() returned {anchor!r}; return 'zero' or 'w0'.")
        self.anchor = W0Anchor(self.optimizer) if anchor == "w0" else None
        early, plateau = experiment.early_stopping(), experiment.plateau()
        setup.check_kind(name, "early_stopping", early, EarlyStopping)
        setup.check_kind(name, "plateau", plateau, Plateau)
        self.ranking = ranking.resolve(
            experiment, self.checkpointer, list(self.data), early, plateau
        )
        mode = self.ranking.monitor[1] if self.ranking.monitor else "min"
        self.early_stopper = EarlyStopper(early, mode) if early is not None else None
        self.plateau = plateau.build(self.optimizer, mode) if plateau is not None else None

    def _start_history(self, entries: list[manifest.ManifestEntry], logger: Any) -> None:
        """The logger, the counters and history of a fresh handle, the stop flag."""
        self.logger = choose_logger(self.experiment, logger)
        if not self.dist.main:  # rank 0 logs for the run
            self.logger = MutedLogger(self.logger.backend)
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
            load_weights(self, self.options.weights, entries)
            self.parent = _weights_parent(self.options.weights, self)
        self._resumption = Resumption(None, rng.capture())
        return None

    def _lend_parts(self) -> Parts:
        """What the points of this handle use of it, the record writer among them: every
        rank's (FSDP: each writes its shards; DDP: rank 0 writes, every rank agrees on
        errors)."""
        ckpt, writer = self.checkpointer, None
        if ckpt is not None:
            fsdp = self.dist.strategy == "fsdp"
            fmt = (
                RecordDirectory(self.dist, ckpt.async_write) if fsdp else OneFile(ckpt.async_write)
            )
            writer = RecordWriter(
                self.run_dir, ckpt, self.run_id, self.ranking.pair, self.parent, self.dist, fmt
            )
        return Parts(
            self._resumption, self._forward_model, writer, self._progress, self._decide_stop,
            self._snapshot,
        )  # fmt: skip

    def _resume_point(self, entries: list[manifest.ManifestEntry]) -> ResumePoint | None:
        resume = self.options.resume
        if resume is None:
            return None
        if resume == "auto":
            if not entries:
                warnings.warn(
                    f"resume='auto' found nothing to resume in {str(self.run_dir)!r}; starting a fresh run.",
                    NitroWarning,
                    stacklevel=3,
                )
                return None
            return latest_point(entries, self.run_dir)
        return resume_from_source(resume, self.run_dir, entries)

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
                raise TrainingRefused(
                    f"Run {self.run_id} in {str(self.run_dir)!r} is being trained by another process "
                    "right now; two processes continuing one run would overwrite each other's "
                    "records. Wait for it to end, or start a separate run (resume='false', or "
                    "another run_dir)."
                )
            if self.dist.main:
                self._refuse_stale_point()
            self._refuse_spent_budget()
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

    def _refuse_stale_point(self) -> None:
        """Refuse to train when the run moved on since this handle was built (another handle
        or process trained it further): its epochs would be written twice under one id."""
        ahead = [
            e
            for e in manifest.read_manifest(self.run_dir)
            if e.run == self.run_id and e.step > self.step
        ]
        if ahead:
            e = ahead[-1]
            raise TrainingRefused(
                f"Run {self.run_id} in {str(self.run_dir)!r} has moved on since this handle was "
                f"built: the handle is at epoch {self.epoch} (step {self.step}), and the manifest "
                f"now lists epoch {e.epoch} (step {e.step}, {e.file!r}) written by another handle. "
                "Training from here would write those epochs twice under one run id. Build a new "
                f"handle that continues from there: Nitro(..., run_dir={str(self.run_dir)!r}, "
                f"resume='{self.run_id} => latest')."
            )

    def _refuse_spent_budget(self) -> None:
        """Refuse to train a run whose ``max_steps`` it has reached already."""
        if not self.budget.left(self.step):
            raise TrainingRefused(
                f"Run {self.run_id} in {str(self.run_dir)!r} is at step {self.step}, and "
                f"max_steps={self.budget.max_steps} leaves no step to train. Raise max_steps "
                f"above {self.step} (it counts the run's steps from its start), or leave it out."
            )

    def close(self) -> None:
        """Release the logger's file (``train()`` does this when it returns) and the process
        group, when this handle made it."""
        self.logger.close()
        self.dist.close()

    def __enter__(self) -> Nitro:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _decide_stop(self, metrics: dict[str, float]) -> StopReason | None:
        monitor = self.ranking.monitor
        value = metrics.get(monitor[0]) if monitor and metrics else None
        early = False
        requested = self.dist.any(self._stop.is_set())  # every rank stops at the same point
        budget = self.budget.active and self.dist.any(self.budget.spent(self.step))  # clocks differ
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

    def request_stop(self) -> None:
        """Stop at the next checkpoint point (the epoch's end, or with ``every_steps`` the
        next mid-epoch point), once it has been validated and checkpointed."""
        self._stop.set()

    # -- evaluation -----------------------------------------------------------------------
    def validate(self) -> dict[str, float]:
        """Finalized metrics of the ``val`` split."""
        return self._evaluate_split("val")

    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Finalized metrics of ``split`` (the model's current weights)."""
        return self._evaluate_split(split)

    def _evaluate_split(self, split: str) -> dict[str, float]:
        if split not in self.data:
            raise ConfigError(
                f"{type(self.experiment).__name__}.build_data() has no {split!r} split; it has "
                f"{', '.join(sorted(self.data))}. Return {split!r} from build_data() or evaluate "
                "one of those."
            )
        # evaluation never moves the training trajectory; it runs in the training's precision
        with rng.isolated(), autocast(self.step_settings, self.device):
            return evaluate(
                self.experiment, self._eval_model, self.data[split], self.device, split,
                self.ranking.custom_metrics, self.ranking.with_loss, self._finalize,
            )  # fmt: skip

    def _finalize(self, totals: dict[str, tuple[float, float]], split: str) -> dict[str, float]:
        """The experiment's ``finalize_metrics`` of sums added up over the ranks (each rank
        evaluated its share; under FSDP every rank evaluated all of it)."""
        if self.dist.strategy == "ddp":
            totals = self.dist.reduce_totals(totals)
        return self.experiment.finalize_metrics(totals, split)

    # -- records --------------------------------------------------------------------------
    def _snapshot(self) -> records.Snapshot:
        rng_json, rng_tensors = rng.capture()
        exp = self.experiment
        last = self.history[-1] if self.history else {}
        header = {
            "step": self.step,
            "epoch": self.epoch,
            "seed": self.seed,
            "run": self.run_id,
            "parent": self.parent,
            "experiment": type(exp).__qualname__,
            "config": config_of(exp),
            "host_fields": sorted(host_fields(type(exp))),
            "metrics": last.get("val", {}),
            "metric": self.ranking.pair[0],
            "mode": self.ranking.pair[1],
            "stop_reason": self.stop_reason,
            "history": self.history,
            "rng": rng_json,
            "logger": {"backend": self.logger.backend, "state": self.logger.state()},
            "early_stopping": self.early_stopper.state_dict() if self.early_stopper else None,
            "ema_meta": {"decay": self.ema.decay, "num_updates": self.ema.num_updates}
            if self.ema
            else None,
            "decay_anchor": exp.decay_anchor(),
            "training_step": self.step_settings.header(),
            "w0_checksum": self.anchor.checksum if self.anchor else None,
            "loaded_from": str(self.checkpoint_source) if self.checkpoint_source else None,
            "averaged_from": self.averaged_from,
            "distributed": {"world": self.dist.world, "strategy": self.dist.strategy},
            "environment": {
                "torch": torch.__version__,
                "num_threads": torch.get_num_threads(),
                "device": str(self.device),
            },
        }
        trees = {}
        if self.scheduler is not None:
            trees["scheduler"] = self.scheduler.state_dict()
        if self.plateau is not None:
            trees["plateau"] = self.plateau.state_dict()
        if self.stepper is not None and self.stepper.scaler is not None:
            trees["scaler"] = self.stepper.scaler.state_dict()
        return records.Snapshot(
            header=header,
            model=self.model,
            optimizer=self.optimizer,
            trees=trees,
            ema=self.ema.shadow if self.ema else None,
            rng_tensors=rng_tensors,
        )

    def __repr__(self) -> str:
        return (
            f"Nitro({type(self.experiment).__name__}, run_dir={str(self.run_dir)!r}, "
            f"run_id={self.run_id!r}, epoch={self.epoch}, step={self.step})"
        )


def _weights_parent(source: Any, n: Nitro) -> str | None:
    """What a run started with ``weights=`` branched from, for its entries' ``parent``:
    '<run>/<file>' of the record loaded, or '<run> => Average(...)' for an average."""
    if isinstance(source, Pair) and isinstance(source.pick, Average) and n.averaged_from:
        return f"{n.averaged_from['run']} => {source.pick}"
    if n.checkpoint_source is None:
        return None
    if isinstance(source, HFDirectory):  # no record header: the directory it came from
        return f"{HF_PREFIX}{n.checkpoint_source}"
    run = store.read_header(n.checkpoint_source).get("run") or "?"
    return f"{run}/{n.checkpoint_source.name}"


def checkpoint_run(nitro: Nitro) -> str:
    """The run id a handle writes its records under."""
    return nitro.run_id
