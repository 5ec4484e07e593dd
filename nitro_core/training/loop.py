"""The training loop: one epoch of optimizer steps, and one pass of evaluation.

Collaborators (scheduler, EMA, progress, the stop flag) are passed in; checkpointing and
logging happen in the handle between epochs, never inside the step loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass
from typing import Any

import torch

from nitro_core.errors import NonFiniteLoss
from nitro_core.experiment import Experiment
from nitro_core.state.anchor import W0Anchor
from nitro_core.state.ema import EMATracker
from nitro_core.training.progress import Progress


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a batch (tensor, dict, list or tuple) to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def batch_size(batch: Any) -> int:
    """Rows in a batch: the length of its first tensor (1 when it holds none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    values = (
        batch.values()
        if isinstance(batch, dict)
        else batch
        if isinstance(batch, list | tuple)
        else ()
    )
    for v in values:
        n = batch_size(v)
        if n:
            return n
    return 1


@dataclass
class StepHooks:
    """What happens after each optimizer step besides the step itself."""

    scheduler: Any = None
    ema: EMATracker | None = None
    anchor: W0Anchor | None = None
    progress: Progress | None = None


def train_epoch(
    exp: Experiment,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Any],
    device: torch.device,
    hooks: StepHooks,
    epoch: int,
    step: int,
) -> tuple[float, int]:
    """One pass over ``batches``; returns (mean training loss, the step count after it)."""
    model.train()
    move = device.type != "cpu"
    total = len(batches) if isinstance(batches, Sized) else None
    loss_sum = torch.zeros((), device=device)
    first_bad = torch.full((), -1, dtype=torch.long, device=device)  # batch of the first NaN
    n = 0
    for batch in batches:
        if move:
            batch = to_device(batch, device)
        loss = exp.loss(model, batch)  # scalar
        # remember the first non-finite loss on the device: no host sync per step
        seen = torch.isfinite(loss.detach()) | (first_bad >= 0)
        first_bad = torch.where(seen, first_bad, n)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # per-step collaborators
        if hooks.anchor is not None:
            hooks.anchor.apply()
        if hooks.scheduler is not None:
            hooks.scheduler.step()
        if hooks.ema is not None:
            hooks.ema.update()
        loss_sum += loss.detach()
        n += 1
        step += 1
        if hooks.progress is not None:
            hooks.progress.update(epoch, exp.max_epochs, n, total)
    if (bad := int(first_bad.item())) >= 0:
        raise NonFiniteLoss(
            f"The training loss became non-finite at epoch {epoch}, step {step - n + bad + 1} "
            f"(batch {bad + 1} of the epoch): the run stopped before writing anything for epoch "
            f"{epoch}, and the records already on disk stay. Lower the learning rate, clip "
            "gradients or check the data, then continue from the last record with resume='auto'."
        )
    return (loss_sum.item() / n if n else float("nan")), step


@torch.no_grad()
def evaluate(
    exp: Experiment,
    model: torch.nn.Module,
    batches: Iterable[Any],
    device: torch.device,
    split: str,
    custom: bool,
    with_loss: bool,
    finalize: Callable[[dict[str, tuple[float, float]], str], dict[str, float]],
) -> dict[str, float]:
    """Finalized metrics of ``split``: the experiment's ``metrics`` when ``custom``, and the
    mean loss as ``loss`` when ``with_loss``."""
    was_training = model.training
    model.eval()
    totals: dict[str, list[Any]] = {}
    try:
        for batch in batches:
            if device.type != "cpu":
                batch = to_device(batch, device)
            if custom:
                for name, (s, c) in exp.metrics(model, batch).items():
                    acc = totals.setdefault(name, [0.0, 0.0])
                    acc[0] += s.detach() if isinstance(s, torch.Tensor) else s
                    acc[1] += c.detach() if isinstance(c, torch.Tensor) else c
            if with_loss:
                rows = batch_size(batch)
                acc = totals.setdefault("loss", [0.0, 0.0])
                acc[0] += exp.loss(model, batch).detach() * rows
                acc[1] += rows
    finally:
        model.train(was_training)
    return finalize({k: (float(s), float(c)) for k, (s, c) in totals.items()}, split)
