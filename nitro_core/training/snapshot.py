"""What a record holds of a handle: the header's fields and the state trees, taken at a point.

:func:`take` reads the handle through :class:`Recorded` (its public attributes) and returns
a :class:`~nitro_core.state.records.Snapshot`: the JSON header that
:class:`~nitro_core.state.header.RecordHeader` describes (less the parts the writer adds:
format, layout, digest), the model, optimizer and EMA tensors, the scheduler, plateau and
scaler trees and the generators. A point adds where a mid-epoch record's epoch stands
(:func:`nitro_core.training.points.snapshot`); a restore reads it all back
(:mod:`nitro_core.training.restore`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from nitro_core.experiment import Experiment, config_of, host_fields
from nitro_core.state import records, rng
from nitro_core.state.anchor import W0Anchor
from nitro_core.state.ema import EMATracker
from nitro_core.store.manifest import StopReason
from nitro_core.training.budget import Budget
from nitro_core.training.distributed import Dist
from nitro_core.training.loggers import Logger
from nitro_core.training.ranking import Ranking
from nitro_core.training.step import Stepper, StepSettings
from nitro_core.training.stopping import EarlyStopper


class Recorded(Protocol):
    """The handle as its records see it: public attributes only (``Nitro`` is one)."""

    experiment: Experiment
    step_settings: StepSettings
    device: torch.device
    dist: Dist
    ranking: Ranking
    logger: Logger
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    plateau: Any
    stepper: Stepper | None
    early_stopper: EarlyStopper | None
    ema: EMATracker | None
    anchor: W0Anchor | None
    components: dict[str, Any]  # Experiment.stateful's, by name
    seed: int
    run_id: str
    parent: str | None
    parent_diff: dict[str, list[Any]] | None
    budget: Budget
    step: int
    epoch: int
    stop_reason: StopReason | None
    history: list[dict[str, Any]]
    checkpoint_source: Path | str | None  # on object storage the record's URL
    averaged_from: dict[str, Any] | None


def take(n: Recorded) -> records.Snapshot:
    """The handle's state for a record, its generators captured now."""
    rng_json, rng_tensors = rng.capture()
    exp = n.experiment
    last = n.history[-1] if n.history else {}
    header = {
        "step": n.step,
        "epoch": n.epoch,
        "seed": n.seed,
        "run": n.run_id,
        "parent": n.parent,
        "parent_diff": n.parent_diff,
        "experiment": type(exp).__qualname__,
        "config": config_of(exp),
        "host_fields": sorted(host_fields(type(exp))),
        "metrics": last.get("val", {}),
        "budget": n.budget.header(),
        "metric": n.ranking.pair[0],
        "mode": n.ranking.pair[1],
        "stop_reason": n.stop_reason,
        "history": n.history,
        "rng": rng_json,
        "logger": {"backend": n.logger.backend, "state": n.logger.state()},
        "early_stopping": n.early_stopper.state_dict() if n.early_stopper else None,
        "ema_meta": {"decay": n.ema.decay, "num_updates": n.ema.num_updates} if n.ema else None,
        "decay_anchor": exp.decay_anchor(),
        "training_step": n.step_settings.header(),
        "w0_checksum": n.anchor.checksum if n.anchor else None,
        "loaded_from": str(n.checkpoint_source) if n.checkpoint_source else None,
        "averaged_from": n.averaged_from,
        "distributed": {"world": n.dist.world, "strategy": n.dist.strategy},
        "environment": {
            "torch": torch.__version__,
            "num_threads": torch.get_num_threads(),
            "device": str(n.device),
        },
    }
    trees = {}
    if n.scheduler is not None:
        trees["scheduler"] = n.scheduler.state_dict()
    if n.plateau is not None:
        trees["plateau"] = n.plateau.state_dict()
    if n.stepper is not None and n.stepper.scaler is not None:
        trees["scaler"] = n.stepper.scaler.state_dict()
    if n.components:
        trees["stateful"] = {name: c.state_dict() for name, c in n.components.items()}
    return records.Snapshot(
        header=header,
        model=n.model,
        optimizer=n.optimizer,
        trees=trees,
        ema=n.ema.shadow if n.ema else None,
        rng_tensors=rng_tensors,
    )
