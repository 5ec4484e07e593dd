"""``Nitro``: the handle that sets a run up, trains it, validates it and checkpoints it.

Everything is resolved at construction (setup): the experiment's hooks, the data, the
ranking, the checkpoint to resume or load; a refusal is raised there, before any training.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nitro_core.errors import ConfigError, NitroWarning, TrainingRefused
from nitro_core.experiment import Experiment, check_required_hooks, config_of, host_fields
from nitro_core.policy.selectors import Checkpointer
from nitro_core.state import records, rng
from nitro_core.state.anchor import W0Anchor
from nitro_core.state.ema import EMA, EMATracker
from nitro_core.store import manifest
from nitro_core.store import recordio as store
from nitro_core.store.manifest import StopReason
from nitro_core.training import ranking, setup
from nitro_core.training.checkpointing import CheckpointWriter
from nitro_core.training.loop import StepHooks, evaluate, train_epoch
from nitro_core.training.options import check_options
from nitro_core.training.progress import Progress
from nitro_core.training.restore import BestRestorer, load_weights, restore_full
from nitro_core.training.resume import ResumePoint, latest_point, resume_from_source
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
    ) -> None:
        if not isinstance(experiment, Experiment):
            raise ConfigError(
                f"Nitro(experiment=...) got {type(experiment).__name__}; pass an instance of an "
                "Experiment subclass, e.g. Nitro(Regression(hidden=64))."
            )
        check_required_hooks(experiment)
        self.experiment = experiment
        name = type(experiment).__name__
        ckpt = experiment.checkpointer()
        if ckpt is not None and not isinstance(ckpt, Checkpointer):
            raise ConfigError(
                f"{name}.checkpointer() returned {ckpt!r}; return Checkpointer(keep=...) or None."
            )
        self.checkpointer: Checkpointer | None = ckpt
        self.run_dir = setup.resolve_run_dir(run_dir, ckpt, name)
        self.device = setup.resolve_device(device)
        self.options = check_options(
            resume, weights, restore_optimizer, restore_best, load_ema, strict
        )
        entries = manifest.read_manifest(self.run_dir)
        setup.warn_partial_files(self.run_dir)

        # which record, if any, this handle continues
        point = self._resume_point(entries)
        if point is not None:
            point.check_resumable()
            point.check_config(experiment)
            if seed is not None and seed != point.seed:
                warnings.warn(
                    f"seed={seed} ignored: resuming {point.file!r} restores its recorded seed "
                    f"{point.seed}. Drop the seed keyword, or start a new run_dir to use seed={seed}.",
                    NitroWarning,
                    stacklevel=2,
                )
            seed = point.seed
            point.check_environment(torch.get_num_threads(), self.device)
        self.seed = setup.check_seed(seed)
        self.run_id = point.continue_run if point and point.continue_run else secrets.token_hex(4)
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
                stacklevel=2,
            )

        # build everything from the seed
        rng.seed_everything(self.seed)
        self.data = setup.build_splits(experiment)
        self.model = experiment.build_model().to(self.device)
        self.optimizer = experiment.build_optimizer(self.model)
        train = self.data["train"]
        steps = experiment.max_epochs * len(train) if hasattr(train, "__len__") else None
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
        self.ranking = ranking.resolve(experiment, ckpt, list(self.data), early, plateau)
        mode = self.ranking.monitor[1] if self.ranking.monitor else "min"
        self.early_stopper = EarlyStopper(early, mode) if early is not None else None
        self.plateau = plateau.build(self.optimizer, mode) if plateau is not None else None
        self.logger = experiment.logger()
        self.step = 0
        self.epoch = 0
        self.history: list[dict[str, Any]] = []
        self.stop_reason: StopReason | None = None
        self._stop = threading.Event()
        self._progress = Progress()
        self._best = BestRestorer(self, self.options.restore_best)
        ranking.warn_about_directory(entries, ckpt, self.run_id, self.ranking, self.run_dir)

        # load what was asked for; the RNG state is put back when train() starts
        logger_state = None
        self._start_rng: rng.RngState | None
        if point is not None:
            logger_state, self._start_rng = restore_full(self, point)
        else:
            if self.options.weights is not None:
                load_weights(self, self.options.weights, entries)
            self._start_rng = rng.capture()
        # the handle touches none of the run's files until train() holds the run
        self.logger.open(
            self.run_dir, self.run_id, logger_state if point and point.continue_run else None
        )
        self._writer = (
            CheckpointWriter(self.run_dir, ckpt, self.run_id, self.ranking.pair, self.parent)
            if ckpt is not None
            else None
        )

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
    def train(self, on_epoch: Callable[[dict[str, Any]], None] | None = None) -> Nitro:
        """Train to ``max_epochs`` (or an early stop, or a requested stop); returns self.

        ``on_epoch(row)`` is called after each epoch has been validated, logged and
        checkpointed, with its history row."""
        self._best.refuse_training()
        hooks = StepHooks(self.scheduler, self.ema, self.anchor, self._progress)
        with store.run_lock(self.run_dir, self.run_id) as mine:
            if not mine:
                raise TrainingRefused(
                    f"Run {self.run_id} in {str(self.run_dir)!r} is being trained by another process "
                    "right now; two processes continuing one run would overwrite each other's "
                    "records. Wait for it to end, or start a separate run (resume='false', or "
                    "another run_dir)."
                )
            self._refuse_stale_point()
            if self._start_rng is not None:  # the first train() starts where setup left off
                rng.restore(*self._start_rng)
                self._start_rng = None
            self._stop.clear()
            previous = setup.install_sigint(self.request_stop)
            try:
                while self.epoch < self.experiment.max_epochs:
                    row = self._epoch(hooks)
                    if on_epoch is not None:
                        on_epoch(row)
                    if self.stop_reason is not None:
                        break
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

    def _epoch(self, hooks: StepHooks) -> dict[str, Any]:
        """One epoch: train, validate, decide whether to stop, log, checkpoint."""
        exp = self.experiment
        epoch = self.epoch + 1
        started = time.monotonic()
        # optimizer steps over the train split
        train_loss, self.step = train_epoch(
            exp,
            self.model,
            self.optimizer,
            self.data["train"],
            self.device,
            hooks,
            epoch,
            self.step,
        )
        self.epoch = epoch
        # validate, then check what is watched (a missing or NaN monitor raises here)
        metrics = self._evaluate_split("val") if self.ranking.has_val else {}
        if metrics:
            ranking.check_metrics(type(exp).__name__, metrics, self.ranking, epoch)
        self.stop_reason = self._decide_stop(metrics)
        # log, then checkpoint (the record holds the logger's offset after this row)
        row = {
            "epoch": epoch,
            "step": self.step,
            "train_loss": train_loss,
            "lr": self.optimizer.param_groups[0]["lr"],
            "val": metrics,
            "seconds": round(time.monotonic() - started, 4),
        }
        self.history.append(row)
        self.logger.log({"run": self.run_id, **row})
        if self._writer is not None:
            score = metrics.get(self.ranking.pair[0]) if self.ranking.pair[0] else None
            self._writer.save(epoch, self.step, score, self.stop_reason, self._snapshot)
        self._progress.epoch_end(setup.summary(row))
        return row

    def close(self) -> None:
        """Release the logger's file (``train()`` does this when it returns)."""
        self.logger.close()

    def __enter__(self) -> Nitro:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _decide_stop(self, metrics: dict[str, float]) -> StopReason | None:
        monitor = self.ranking.monitor
        value = metrics.get(monitor[0]) if monitor and metrics else None
        early = False
        if value is not None:
            if self.plateau is not None:
                self.plateau.step(value)
            if self.early_stopper is not None:
                early = self.early_stopper.update(value)
        if early:
            return "early_stop"
        if self._stop.is_set():
            return "requested"
        if self.epoch >= self.experiment.max_epochs:
            return "completed"
        return None

    def request_stop(self) -> None:
        """Stop after the current epoch has finished, validated and checkpointed."""
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
        with rng.isolated():  # evaluation never moves the training trajectory
            return evaluate(
                self.experiment, self.model, self.data[split], self.device, split,
                self.ranking.custom_metrics, self.ranking.with_loss,
                self.experiment.finalize_metrics,
            )  # fmt: skip

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
            "w0_checksum": self.anchor.checksum if self.anchor else None,
            "loaded_from": str(self.checkpoint_source) if self.checkpoint_source else None,
            "averaged_from": self.averaged_from,
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


def checkpoint_run(nitro: Nitro) -> str:
    """The run id a handle writes its records under."""
    return nitro.run_id
