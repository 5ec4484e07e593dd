"""Exponential moving average of a model's weights, kept beside the model while training
and stored in every record under ``ema/``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from nitro_core.errors import ConfigError


@dataclass(frozen=True)
class EMA:
    """``ema()`` returns one of these: ``shadow = decay * shadow + (1 - decay) * weights``
    after every optimizer step, for every floating parameter and buffer."""

    decay: float = 0.999

    def __post_init__(self) -> None:
        if not 0.0 < self.decay < 1.0:
            raise ConfigError(
                f"EMA(decay={self.decay!r}): decay must lie in (0, 1); write EMA(decay=0.999)."
            )


class EMATracker:
    """The live average of one model."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.decay = decay
        self.num_updates = 0
        live = model.state_dict(keep_vars=True)
        seen: set[int] = set()
        self._live: dict[str, torch.Tensor] = {}
        for key, t in live.items():
            if id(t) not in seen:
                seen.add(id(t))
                self._live[key] = t
        self.shadow = {k: t.detach().clone() for k, t in self._live.items()}
        # floating tensors grouped by their type: one foreach call per group, since under FSDP
        # the parameters are DTensors and the buffers (BatchNorm's statistics) plain tensors
        groups: dict[type, list[str]] = {}
        for k, t in self._live.items():
            if t.is_floating_point():
                groups.setdefault(type(t), []).append(k)
        self._float = list(groups.values())
        self._other = [k for k, t in self._live.items() if not t.is_floating_point()]

    @torch.no_grad()
    def update(self) -> None:
        for keys in self._float:
            torch._foreach_lerp_(
                [self.shadow[k] for k in keys],
                [self._live[k].detach() for k in keys],
                1.0 - self.decay,
            )
        for k in self._other:
            self.shadow[k].copy_(self._live[k])
        self.num_updates += 1

    def reset(self) -> None:
        """Start the average over from the model's current weights."""
        with torch.no_grad():
            for k, t in self.shadow.items():
                t.copy_(self._live[k])
        self.num_updates = 0

    def load(self, shadow: Mapping[str, torch.Tensor], num_updates: int) -> None:
        with torch.no_grad():
            for k, t in self.shadow.items():
                t.copy_(shadow[k])
        self.num_updates = num_updates
