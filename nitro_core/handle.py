"""``Nitro``: the handle that sets a run up, trains it, validates it and checkpoints it.

Everything is resolved at construction (setup): the experiment's hooks, the data, the
ranking, the checkpoint to resume; a refusal is raised there, before any training.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from nitro_core import manifest, ranking, records, rng
from nitro_core.checkpointing import CheckpointWriter
from nitro_core.ema import EMA, EMATracker
from nitro_core.errors import ConfigError
from nitro_core.experiment import Experiment, check_required_hooks, config_of, host_fields
from nitro_core.loop import StepHooks, evaluate, train_epoch
from nitro_core.manifest import StopReason
from nitro_core.progress import Progress
from nitro_core.resume import ResumePoint, resolve_resume
from nitro_core.selectors import Checkpointer
from nitro_core.stopping import EarlyStopper, EarlyStopping, Plateau

log = logging.getLogger(__name__)


class Nitro:
    """A training run of one experiment in one run directory.

    ``resume``: ``False`` (a fresh run), ``"auto"`` (the latest record of the latest run,
    or a fresh run with a warning when the directory holds none), or a source naming a
    record. ``seed`` defaults to 0; a resume restores the recorded seed.
    """

    def __init__(
        self,
        experiment: Experiment,
        run_dir: str | Path | None = None,
        seed: int | None = None,
        resume: Any = False,
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
        self.run_dir = _run_dir(run_dir, ckpt, name)
        self.device = _device(device)

        # which record, if any, this handle continues
        point = resolve_resume(resume, self.run_dir)
        if point is not None:
            point.check_config(experiment)
            if seed is not None and seed != point.seed:
                warnings.warn(
                    f"seed={seed} ignored: resuming {point.file!r} restores its recorded seed "
                    f"{point.seed}. Drop the seed keyword, or start a new run_dir to use seed={seed}.",
                    stacklevel=2,
                )
            seed = point.seed
            point.check_environment(torch.get_num_threads(), self.device)
        self.seed = 0 if seed is None else int(seed)
        self.run_id = point.continue_run if point and point.continue_run else secrets.token_hex(4)
        self.parent = point.parent if point else None
        self.checkpoint_source = point.path if point else None
        self.averaged_from = None

        # build everything from the seed
        rng.seed_everything(self.seed)
        self.data = _data(experiment)
        self.model = experiment.build_model().to(self.device)
        self.optimizer = experiment.build_optimizer(self.model)
        train = self.data["train"]
        steps = experiment.max_epochs * len(train) if hasattr(train, "__len__") else None
        self.scheduler = experiment.lr_scheduler(self.optimizer, steps)
        ema = experiment.ema()
        if ema is not None and not isinstance(ema, EMA):
            raise ConfigError(f"{name}.ema() returned {ema!r}; return EMA(decay=0.999) or None.")
        self.ema = EMATracker(self.model, ema.decay) if ema is not None else None
        early, plateau = experiment.early_stopping(), experiment.plateau()
        _check_kind(name, "early_stopping", early, EarlyStopping)
        _check_kind(name, "plateau", plateau, Plateau)
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
        self._w0 = _checksum(self.model) if experiment.decay_anchor() == "w0" else None
        ranking.warn_about_directory(
            manifest.read_manifest(self.run_dir), ckpt, self.run_id, self.ranking, self.run_dir
        )
        logger_state = None
        if point is not None:
            logger_state = self._restore(point)
        self.logger.open(
            self.run_dir, self.run_id, logger_state if point and point.continue_run else None
        )
        self._writer = (
            CheckpointWriter(self.run_dir, ckpt, self.run_id, self.ranking.pair, self.parent)
            if ckpt is not None
            else None
        )

    # -- training -------------------------------------------------------------------------
    def train(self) -> Nitro:
        """Train to ``max_epochs`` (or an early stop, or a requested stop); returns self."""
        exp = self.experiment
        hooks = StepHooks(self.scheduler, self.ema, self._progress)
        self._stop.clear()
        previous = _install_sigint(self.request_stop)
        try:
            while self.epoch < exp.max_epochs:
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
                # validate, then check what is watched
                metrics = self._validate_split("val") if self.ranking.has_val else {}
                if metrics:
                    ranking.check_metrics(type(exp).__name__, metrics, self.ranking, epoch)
                stop_reason = self._decide_stop(metrics)
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
                self.stop_reason = stop_reason
                if self._writer is not None:
                    score = metrics.get(self.ranking.pair[0]) if self.ranking.pair[0] else None
                    self._writer.save(epoch, self.step, score, stop_reason, self._snapshot)
                self._progress.epoch_end(_summary(row))
                if stop_reason is not None:
                    break
        finally:
            _restore_sigint(previous)
        return self

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
        return self.evaluate("val")

    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Finalized metrics of ``split`` (the model's current weights)."""
        return self._validate_split(split)

    def _validate_split(self, split: str) -> dict[str, float]:
        if split not in self.data:
            raise ConfigError(
                f"{type(self.experiment).__name__}.build_data() has no {split!r} split; it has "
                f"{', '.join(sorted(self.data))}. Return {split!r} from build_data() or evaluate "
                "one of those."
            )
        return evaluate(
            self.experiment, self.model, self.data[split], self.device, split,
            self.ranking.custom_metrics, self.ranking.with_loss, self.experiment.finalize_metrics,
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
            "w0_checksum": self._w0,
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

    def _restore(self, point: ResumePoint) -> dict[str, Any] | None:
        """Load the full training state of ``point``; returns the logger state to reopen."""
        rec = point.load()
        meta = rec.meta
        point.check_layout(records.model_layout(self.model, self.optimizer), self.logger.backend)
        self.model.load_state_dict(rec.model_state())
        self.optimizer.load_state_dict(rec.tree("optimizer"))
        if self.scheduler is not None and meta.get("scheduler") is not None:
            self.scheduler.load_state_dict(rec.tree("scheduler"))
        if self.plateau is not None and meta.get("plateau") is not None:
            self.plateau.load_state_dict(rec.tree("plateau"))
        if self.early_stopper is not None and meta.get("early_stopping") is not None:
            self.early_stopper.load_state_dict(meta["early_stopping"])
        ema_state = rec.ema_state()
        if self.ema is not None and ema_state is not None:
            self.ema.load(ema_state, meta["ema_meta"]["num_updates"])
        self.step, self.epoch = meta["step"], meta["epoch"]
        self.history = list(meta.get("history", []))
        self.stop_reason = None
        rng.restore(meta["rng"], rec.rng_tensors())
        return meta["logger"]["state"]

    def __repr__(self) -> str:
        return (
            f"Nitro({type(self.experiment).__name__}, run_dir={str(self.run_dir)!r}, "
            f"run_id={self.run_id!r}, epoch={self.epoch}, step={self.step})"
        )


def checkpoint_run(nitro: Nitro) -> str:
    """The run id a handle writes its records under."""
    return nitro.run_id


# -- setup helpers ----------------------------------------------------------------------------
def _run_dir(run_dir: str | Path | None, ckpt: Checkpointer | None, name: str) -> Path:
    if ckpt is not None and ckpt.dir is not None:
        if run_dir is not None and Path(run_dir) != Path(ckpt.dir):
            raise ConfigError(
                f"run_dir={str(run_dir)!r} disagrees with Checkpointer(dir={ckpt.dir!r}); give "
                "one of them, or the same directory to both."
            )
        return Path(ckpt.dir)
    return Path(run_dir) if run_dir is not None else Path("runs") / name


def _device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(
            f"device={device!r} is not a device; write 'auto', 'cpu' or 'cuda:0'."
        ) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device={device!r} asks for CUDA, which this machine lacks; write 'auto' or 'cpu'."
        )
    return dev


def _data(exp: Experiment) -> dict[str, Any]:
    name = type(exp).__name__
    data = exp.build_data()
    if not isinstance(data, dict):
        raise ConfigError(
            f"{name}.build_data() returned {type(data).__name__}; return a dict of split name -> "
            "re-iterable of batches, e.g. {'train': ..., 'val': ...}."
        )
    if "train" not in data:
        raise ConfigError(
            f"{name}.build_data() returned the splits {sorted(data)} without 'train'; return "
            "{'train': ..., 'val': ...} ('train' is required to train, 'val' enables ranking)."
        )
    return data


def _check_kind(name: str, hook: str, value: Any, kind: type) -> None:
    if value is not None and not isinstance(value, kind):
        raise ConfigError(
            f"{name}.{hook}() returned {value!r}; return {kind.__name__}(...) or None."
        )


def _checksum(model: torch.nn.Module) -> str:
    sha = hashlib.sha256()
    for key, t in model.state_dict().items():
        sha.update(key.encode())
        sha.update(records.to_host(t).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def _summary(row: dict[str, Any]) -> str:
    val = " ".join(
        f"{k}={v:.4g}" for k, v in row["val"].items() if isinstance(v, float) and math.isfinite(v)
    )
    return f"epoch {row['epoch']} step {row['step']} train_loss={row['train_loss']:.4g} {val}"


def _install_sigint(stop: Any) -> Any:
    """Ctrl+C asks for a graceful stop; a second Ctrl+C interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        return None
    pressed = []

    def handler(signum: int, frame: Any) -> None:
        if pressed:
            raise KeyboardInterrupt
        pressed.append(True)
        stop()

    return signal.signal(signal.SIGINT, handler)


def _restore_sigint(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous)
