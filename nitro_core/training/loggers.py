"""Metrics loggers, and the choice of one for a handle.

The default (:class:`JSONLLogger`, beside the log's one reader in
:mod:`nitro_core.store.metrics_log`) writes one JSON object per line to
``<run_dir>/logs/<run_id>.jsonl``; its state (the byte offset reached) is stored in every
record, so a resume truncates lines written after the record and the log reads as if the
run had never stopped. :class:`TensorBoardLogger` writes TensorBoard event files to
``<run_dir>/logs/tb/<run_id>/`` with the ``tensorboard`` package's own writer, and keeps the
JSONL log beside them (so ``nitro_history`` and ``nitro_plot`` read every run the same way);
a resume opens a new event file that purges the events written after the record.
:class:`~nitro_core.training.mlflow_logger.MLflowLogger` and
:class:`~nitro_core.training.wandb_logger.WandbLogger` send the rows to an MLflow or W&B run
that a resume continues (:mod:`nitro_core.training.trackers`), the JSONL log beside.

A handle takes its logger from ``Nitro(..., logger=...)`` when given (a name of
:data:`LOGGERS` or a logger instance), else from the experiment's ``logger()`` hook
(:func:`choose_logger`); a resume under another backend is refused with what to change
(:func:`check_resume_backend`).
"""

from __future__ import annotations

import importlib.util
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from nitro_core.errors import ConfigError, ResumeRefused
from nitro_core.experiment import config_of
from nitro_core.store.metrics_log import JSONLLogger as JSONLLogger  # re-exported
from nitro_core.store.safeio import confined_dir
from nitro_core.training.mlflow_logger import MLflowLogger
from nitro_core.training.trackers import scalars
from nitro_core.training.wandb_logger import WandbLogger

LOGGERS = ("jsonl", "tensorboard", "mlflow", "wandb")  # what Nitro(logger=...) and tools take
# the instance each name stands for, as a refusal writes it
LOGGER_CALLS = {
    "jsonl": "JSONLLogger()",
    "tensorboard": "TensorBoardLogger()",
    "mlflow": "MLflowLogger()",
    "wandb": "WandbLogger()",
    "null": "NullLogger()",
}
INSTALL_TENSORBOARD = "pip install 'nitro[tensorboard]' (or pip install 'tensorboard>=2.14')"


class Logger(Protocol):
    backend: str

    def open(self, run_dir: Path, run_id: str, state: dict[str, Any] | None) -> None: ...
    def log(self, row: dict[str, Any]) -> None: ...
    def state(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


class TensorBoardLogger:
    """TensorBoard event files in ``<run_dir>/logs/tb/<run_id>/``, and the JSONL log too.

    Each row becomes scalars at the row's optimizer ``step``: ``train_loss``, ``lr``,
    ``seconds``, ``epoch`` and ``val/<metric>`` (a nested dict ``d`` gives ``d/<name>``).
    Events are flushed with every row, before the epoch's record is written, so a record's
    ``step`` is in the event files. A resume opens a new event file whose first event asks
    readers to drop every earlier event past the record's step (TensorBoard's
    ``purge_step``): the series reads as if the run had never stopped. Needs the
    ``tensorboard`` package: ``pip install 'nitro[tensorboard]'``."""

    backend = "tensorboard"

    def __init__(self) -> None:
        self._writer_class = _summary_writer()  # refused here, at setup, when not installed
        self._jsonl = JSONLLogger()
        self._writer: Any = None
        self.run_dir: Path | None = None
        self.log_dir: Path | None = None
        self._step: int | None = None  # the step of the last row logged
        self._purge: int | None = None  # the first step a resume drops from earlier files

    def open(self, run_dir: Path, run_id: str, state: dict[str, Any] | None) -> None:
        """Remember where to log; like :class:`JSONLLogger`, nothing is written until the
        first row. ``state`` (a record's) makes the first event file purge what followed."""
        state = state or {}
        self._jsonl.open(run_dir, run_id, state.get("jsonl") if state else None)
        self.run_dir = Path(run_dir)
        self.log_dir = self.run_dir / "logs" / "tb" / run_id
        self._step = state.get("step")
        self._purge = None if self._step is None else int(self._step) + 1

    def _events(self) -> Any:
        if self._writer is None:
            assert self.run_dir is not None and self.log_dir is not None  # open() ran first
            confined_dir(self.run_dir, self.log_dir)
            _after_existing_files(self.log_dir)
            self._writer = self._writer_class(
                str(self.log_dir), purge_step=self._purge, flush_secs=3600
            )
            self._purge = None  # purge once; a later reopen appends
        return self._writer

    def log(self, row: dict[str, Any]) -> None:
        self._jsonl.log(row)
        writer, step = self._events(), int(row["step"])
        for tag, value in scalars(row):
            writer.add_scalar(tag, value, global_step=step)
        writer.flush()
        self._step = step

    def state(self) -> dict[str, Any]:
        return {"jsonl": self._jsonl.state(), "step": self._step}

    def close(self) -> None:
        self._jsonl.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class NullLogger:
    """Logs nothing."""

    backend = "null"

    def open(self, run_dir: Path, run_id: str, state: dict[str, Any] | None) -> None:
        pass

    def log(self, row: dict[str, Any]) -> None:
        pass

    def state(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def choose_logger(experiment: Any, choice: Any) -> Logger:
    """The handle's logger: ``choice`` (a name of :data:`LOGGERS` or a logger instance) when
    given, else what the experiment's ``logger()`` hook returns. A name's MLflow or W&B
    logger carries the experiment's config as its params."""
    name = type(experiment).__name__
    if choice is None:
        made = experiment.logger()
        if not _is_logger(made):
            raise ConfigError(
                f"{name}.logger() returned {made!r}; return a logger such as JSONLLogger() or "
                "TensorBoardLogger() (an object with backend, open, log, state and close)."
            )
        return made  # checked by _is_logger just above
    if choice == "jsonl":
        return JSONLLogger()
    if choice == "tensorboard":
        return TensorBoardLogger()
    if choice == "mlflow":
        return MLflowLogger(params=config_of(experiment))
    if choice == "wandb":
        return WandbLogger(params=config_of(experiment))
    if isinstance(choice, str) or not _is_logger(choice):
        shown = repr(choice) if len(repr(choice)) <= 60 else repr(choice)[:57] + "..."
        raise ConfigError(
            f"Nitro(logger={shown}) is not a logger; write logger='jsonl', 'tensorboard', "
            "'mlflow' or 'wandb', a logger instance such as TensorBoardLogger(), or leave it "
            f"out to use {name}.logger()."
        )
    return choice  # checked by _is_logger just above


def check_resume_backend(file: str, recorded: str | None, chosen: str, experiment: Any) -> None:
    """A resume keeps the logger backend its record was written with (its state is that
    backend's); refused otherwise, naming what to change: ``Nitro(logger=...)`` or the
    experiment's ``logger()`` hook (the hook is called to tell which one chose)."""
    if recorded is None or recorded == chosen:
        return
    name = type(experiment).__name__
    hooked = getattr(experiment.logger(), "backend", None)
    make = LOGGER_CALLS.get(recorded, f"a {recorded!r} logger")
    if recorded == hooked:  # so logger= chose another
        fix = f"Leave logger= out of Nitro(...): {name}.logger() returns {make}"
    elif recorded in LOGGERS:
        fix = (
            f"Write Nitro(..., logger={recorded!r}) (or, without logger=, return {make} "
            f"from {name}.logger())"
        )
    else:
        fix = f"Return {make} from {name}.logger() (without logger=), or pass logger={make}"
    raise ResumeRefused(
        f"Cannot resume {file!r}: its logger state is for the {recorded!r} backend, this "
        f"handle logs with {chosen!r}: a resume keeps the run's logger so that its logs "
        f"continue without gaps or repeats. {fix}; or start a new run_dir."
    )


def installed(backend: str) -> bool:
    """Whether the package a named logger writes with is here (found, not imported: torch
    and the trackers stay out of light entry points). ``"jsonl"`` needs none."""
    package = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}.get(backend)
    return package is None or importlib.util.find_spec(package) is not None


def tensorboard_installed() -> bool:
    """Whether :class:`TensorBoardLogger` can write here (checked without importing torch)."""
    return installed("tensorboard")


def _is_logger(obj: Any) -> bool:
    return isinstance(getattr(obj, "backend", None), str) and all(
        callable(getattr(obj, m, None)) for m in ("open", "log", "state", "close")
    )


def _summary_writer() -> Any:
    """``torch.utils.tensorboard.SummaryWriter``, or the refusal naming how to install it."""
    if not tensorboard_installed():
        raise ConfigError(
            "TensorBoardLogger needs the tensorboard package, which is not installed: "
            f"{INSTALL_TENSORBOARD}. Or log with JSONLLogger() (logger='jsonl')."
        )
    from torch.utils.tensorboard import SummaryWriter  # lazy: imports tensorboard

    return SummaryWriter


def _after_existing_files(log_dir: Path) -> None:
    """Wait (under a second) until a new event file's name, which starts with the current
    whole second, sorts after every file already in ``log_dir``: readers replay the files
    in name order, and a purge must come after the events it drops."""
    newest = -1
    for name in os.listdir(log_dir):
        parts = name.split(".")
        if name.startswith("events.out.tfevents.") and len(parts) > 3 and parts[3].isdigit():
            newest = max(newest, int(parts[3]))
    deadline = time.monotonic() + 2  # a file stamped far ahead (a clock set back): go on
    while math.floor(time.time()) <= newest and time.monotonic() < deadline:
        time.sleep(0.05)


class MutedLogger(NullLogger):
    """Another rank's stand-in for the run's logger: the same backend (so a resume checks
    the same thing on every rank), nothing written (rank 0 logs for the run)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
