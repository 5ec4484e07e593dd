"""The training loop: one epoch of optimizer steps, and one pass of evaluation.

Collaborators (scheduler, EMA, progress, the stop flag) are passed in; checkpointing and
logging happen in the handle at checkpoint points (each epoch end, and with
``Checkpointer(every_steps=N)`` after every N optimizer steps, through ``StepHooks.point``),
never inside the step itself.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from nitro_core.errors import NonFiniteLoss
from nitro_core.experiment import Experiment
from nitro_core.state.anchor import W0Anchor
from nitro_core.state.ema import EMATracker
from nitro_core.training.progress import Progress
from nitro_core.training.step import Stepper

_END = object()  # the end of an epoch's batches


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
    """What happens around each optimizer step: the step itself when it is not the plain
    ``zero_grad(); backward(); step()`` (``stepper``: autocast, accumulation, scaler,
    clipping), and the collaborators after it."""

    scheduler: Any = None
    ema: EMATracker | None = None
    anchor: W0Anchor | None = None
    progress: Progress | None = None
    every_steps: int | None = None  # a mid-epoch checkpoint point after every N optimizer steps
    point: Callable[[Cursor, int], bool] | None = None  # runs one; True: stop the epoch there
    # what a look-ahead moves (generators, the split's position), captured before it: a
    # split without a length is read one batch ahead at a point, to learn whether the epoch
    # ends there (then its end is the point), and the point records the state before the read
    hold: Callable[[], Any] | None = None
    stepper: Stepper | None = None  # None: the plain step (every training-step hook at its default)
    ranks: Callable[[int], list[int]] | None = (
        None  # distributed: every rank's value (check_finite)
    )


FOLD = 256  # losses a step keeps on the device before they are folded into Cursor.first_bad


@dataclass
class Cursor:
    """Where the epoch in progress stands: the batches consumed, the sum of their losses and
    the batch of the first non-finite one (-1: none), all kept on the device so that a step
    never waits for the host. A step adds its loss to the sum and appends it to ``window``
    (no other kernel); every ``FOLD`` steps, and at each point, the window is checked for a
    non-finite loss in a few kernels. A mid-epoch resume starts from the recorded cursor."""

    batches: int
    loss_sum: torch.Tensor  # scalar
    first_bad: torch.Tensor  # scalar long
    window: list[torch.Tensor] = field(default_factory=list)  # losses not yet folded, [k] scalars
    point_step: int = -1  # the step of the last mid-epoch point
    checked: int = 0  # batches already checked finite (at the last point)
    stopped: bool = False  # a point stopped the epoch before its end
    held: Any = None  # StepHooks.hold's capture, at a point that read the next batch ahead

    @classmethod
    def start(cls, device: torch.device, batches: int = 0, loss_sum: Any = None) -> Cursor:
        total = torch.zeros((), device=device) if loss_sum is None else loss_sum.to(device)
        bad = torch.full((), -1, dtype=torch.long, device=device)
        return cls(batches, total, bad, checked=batches)

    def mean_loss(self) -> float:
        return self.loss_sum.item() / self.batches if self.batches else float("nan")


def fold(cursor: Cursor, end: int) -> None:
    """Fold the window, the losses of batches ``end - len(window)`` to ``end - 1`` of the
    epoch (0-based), into ``cursor.first_bad``, on the device (no host sync)."""
    window = cursor.window
    if not window:
        return
    bad = ~torch.isfinite(torch.stack(window))  # [k]
    first = bad.int().argmax() + (end - len(window))  # the first non-finite one, if any
    cursor.first_bad = torch.where((cursor.first_bad < 0) & bad.any(), first, cursor.first_bad)
    window.clear()


def check_finite(
    cursor: Cursor,
    epoch: int,
    step: int,
    accumulate: int = 1,
    ranks: Callable[[int], list[int]] | None = None,
) -> None:
    """Raise :class:`NonFiniteLoss` when a loss of the epoch so far was NaN or infinite (one
    host sync: at a checkpoint point, never per step). ``accumulate``: batches per optimizer
    step (windows start at the epoch's first batch; a short last window steps too).

    ``ranks`` (a distributed run: every rank's value, in rank order, on every rank) makes
    the ranks agree: a loss that went non-finite on one rank only (its own data) stops every
    rank at the same point, naming the earliest batch and its rank, where otherwise that rank
    would stop alone and the others write its poisoned update and wait for it forever."""
    fold(cursor, cursor.batches)
    bad, on = int(cursor.first_bad.item()), ""
    if ranks is not None:
        found = [(b, r) for r, b in enumerate(ranks(bad)) if b >= 0]
        if found:
            bad, rank = min(found)
            on = f" on rank {rank}"
    if bad >= 0:
        started = step - -(-cursor.batches // accumulate)  # the step count when the epoch began
        since = (
            f"for epoch {epoch}"
            if cursor.checked == 0
            else f"past batch {cursor.checked} of epoch {epoch}"
        )
        raise NonFiniteLoss(
            f"The training loss became non-finite at epoch {epoch}, step "
            f"{started + bad // accumulate + 1} (batch {bad + 1} of the epoch{on}): the run stopped "
            f"before writing anything {since}, and the records already on disk stay. Lower the "
            "learning rate, clip gradients or check the data, then continue from the last "
            "record with resume='auto'."
        )
    cursor.checked = cursor.batches


def epoch_length(batches: Any) -> int | None:
    """Batches in an epoch, or None when the split cannot say (no or a failing ``len``)."""
    try:
        return len(batches)
    except TypeError:
        return None


def train_epoch(
    exp: Experiment,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable[Any],
    device: torch.device,
    hooks: StepHooks,
    epoch: int,
    step: int,
    cursor: Cursor | None = None,
    total: int | None = None,
) -> tuple[float, int]:
    """One pass over ``batches`` (the rest of it from ``cursor``, which counts ``total``
    batches in all); returns (mean training loss, the step count after it). A checkpoint
    point that stops the run sets ``cursor.stopped`` and ends the pass there. A point never
    falls on the epoch's last batch: the epoch's end is the point there (a split without a
    length is read one batch ahead at each point to know)."""
    model.train()
    move = device.type != "cpu"
    if cursor is None:
        cursor = Cursor.start(device)
        total = epoch_length(batches)
    loss_sum, window = cursor.loss_sum, cursor.window  # the epoch's, on the device
    n = cursor.batches
    stepper = hooks.stepper
    rest = iter(batches)
    while (batch := next(rest, _END)) is not _END:
        if move:
            batch = to_device(batch, device)
        # forward (under autocast when the precision is mixed)
        if stepper is None:
            loss = exp.loss(model, batch)  # scalar
        else:
            loss = stepper.forward(exp.loss, model, batch)  # scalar
        # sum the loss and keep it for the non-finite check, on the device: no host sync
        detached = loss.detach()
        loss_sum += detached
        window.append(detached)
        n += 1
        if len(window) == FOLD:
            fold(cursor, n)
        # backward and optimizer step: the plain one, or into an accumulation window that
        # steps (scaled, unscaled, clipped) when it is full
        if stepper is None:
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        elif not stepper.backward(loss):
            if hooks.progress is not None:
                hooks.progress.update(epoch, exp.max_epochs, n, total, step, loss_sum)
            continue
        step += 1
        after_step(hooks)
        if hooks.progress is not None:
            hooks.progress.update(epoch, exp.max_epochs, n, total, step, loss_sum)
        # a mid-epoch checkpoint point after every N optimizer steps (the epoch end is one too)
        if (
            hooks.point is not None
            and hooks.every_steps
            and step % hooks.every_steps == 0
            and step != cursor.point_step
            and (total is None or n < total)
        ):
            if total is None:  # the epoch's end is this step's point if no batch follows
                held = hooks.hold() if hooks.hold is not None else None
                if (ahead := next(rest, _END)) is _END:
                    break
                rest, cursor.held = itertools.chain((ahead,), rest), held
            cursor.batches, cursor.point_step = n, step
            if hooks.point(cursor, step):
                cursor.stopped = True
                return cursor.mean_loss(), step
            cursor.held = None
    if stepper is not None and stepper.pending:
        # the epoch ended inside an accumulation window: that short window steps too
        stepper.step()
        step += 1
        after_step(hooks)
    cursor.batches = n
    check_finite(cursor, epoch, step, stepper.accumulate if stepper is not None else 1, hooks.ranks)
    return cursor.mean_loss(), step


def after_step(hooks: StepHooks) -> None:
    """The per-step collaborators, after each optimizer step."""
    if hooks.anchor is not None:
        hooks.anchor.apply()
    if hooks.scheduler is not None:
        hooks.scheduler.step()
    if hooks.ema is not None:
        hooks.ema.update()


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
                acc[0] += exp.loss(model, batch).detach().float() * rows  # fp32 under autocast
                acc[1] += rows
    finally:
        model.train(was_training)
    return finalize({k: (float(s), float(c)) for k, (s, c) in totals.items()}, split)
