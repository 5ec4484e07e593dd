"""Evaluating a handle's data splits: ``validate()``, ``evaluate(split)`` and every point's
validation.

An :class:`Evaluator` owns what evaluation uses: the experiment, the splits, the model's
evaluation forward (compiled when the experiment compiles, never DDP's wrapper: evaluation
syncs nothing, and ranks may evaluate unequal shares), the device and precision, the
ranking's choice of metrics and the process group. Evaluation never moves the training
trajectory (the generators are isolated) and runs in the training's precision; under DDP
the ranks' sums are added up before the experiment's ``finalize_metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from nitro_core.errors import ConfigError
from nitro_core.experiment import Experiment
from nitro_core.state import rng
from nitro_core.training.distributed import Dist
from nitro_core.training.loop import evaluate
from nitro_core.training.ranking import Ranking
from nitro_core.training.step import StepSettings, autocast


@dataclass(frozen=True)
class Evaluator:
    """Finalized metrics of a split of the handle's data, under its current weights."""

    experiment: Experiment
    data: dict[str, Any]
    model: torch.nn.Module  # evaluation's forward passes
    device: torch.device
    settings: StepSettings
    ranking: Ranking
    dist: Dist

    def split(self, split: str) -> dict[str, float]:
        """Finalized metrics of ``split``; a ConfigError names the splits there are."""
        if split not in self.data:
            raise ConfigError(
                f"{type(self.experiment).__name__}.build_data() has no {split!r} split; it has "
                f"{', '.join(sorted(self.data))}. Return {split!r} from build_data() or evaluate "
                "one of those."
            )
        # evaluation never moves the training trajectory; it runs in the training's precision
        with rng.isolated(), autocast(self.settings, self.device):
            return evaluate(
                self.experiment, self.model, self.data[split], self.device, split,
                self.ranking.custom_metrics, self.ranking.with_loss, self.finalize,
            )  # fmt: skip

    def finalize(self, totals: dict[str, tuple[float, float]], split: str) -> dict[str, float]:
        """The experiment's ``finalize_metrics`` of sums added up over the ranks (each rank
        evaluated its share; under FSDP every rank evaluated all of it)."""
        if self.dist.strategy == "ddp":
            totals = self.dist.reduce_totals(totals)
        return self.experiment.finalize_metrics(totals, split)
