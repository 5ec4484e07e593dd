"""Checkpoint points: a handle's epoch, and what happens at each point of it.

A point is an epoch end and, with ``Checkpointer(every_steps=N)``, every N optimizer steps
inside an epoch. At each one the handle waits for the previous asynchronous write (so at
most one is in flight, and a failed one raises here), validates the ``val`` split (isolated
from the training generators, so a run with points trains as one without), checks the
monitor, decides stops (early stopping and plateau count points), logs a history row,
offers a record to the selectors and calls the caller's ``on_epoch``. A mid-epoch record
also holds where the epoch stands (:mod:`nitro_core.training.position`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from nitro_core.errors import NitroWarning
from nitro_core.experiment import Experiment
from nitro_core.policy.selectors import Checkpointer
from nitro_core.state import ranks, records, rng
from nitro_core.store.manifest import StopReason
from nitro_core.training import budget, position, ranking, setup, sharding
from nitro_core.training.checkpointing import RecordWriter
from nitro_core.training.distributed import Dist
from nitro_core.training.loggers import Logger
from nitro_core.training.loop import Cursor, StepHooks, check_finite, epoch_length, train_epoch
from nitro_core.training.position import Position
from nitro_core.training.progress import Progress
from nitro_core.training.step import Stepper

OnPoint = Callable[[dict[str, Any]], None]


class Trainee(Protocol):
    """The handle as its points see it: public attributes only (``Nitro`` is one)."""

    experiment: Experiment
    data: dict[str, Any]
    device: torch.device
    dist: Dist
    checkpointer: Checkpointer | None
    optimizer: torch.optim.Optimizer
    stepper: Stepper | None
    ranking: ranking.Ranking
    logger: Logger
    run_id: str
    step: int
    epoch: int
    batch: int | None
    stop_reason: StopReason | None
    history: list[dict[str, Any]]

    def validate(self) -> dict[str, float]: ...


@dataclass
class Resumption:
    """Where the handle's next epoch starts, kept between ``train()`` calls: a mid-epoch
    record's (or a mid-epoch stop's) position, until the split is positioned, and the
    generators the next ``train()`` starts from."""

    position: Position | None = None
    start_rng: rng.RngState | None = None
    unstored_warned: bool = False  # records cannot hold the train split's state_dict()


@dataclass
class Parts:
    """The handle's own parts its points use, lent as one argument (never read off it)."""

    resumption: Resumption
    forward_model: torch.nn.Module  # training's forward passes (DDP's wrapper, compiled)
    writer: RecordWriter | None  # None: the experiment keeps no checkpoints
    progress: Progress
    decide_stop: Callable[[dict[str, float], int | None], StopReason | None]  # (metrics, next)
    snapshot: Callable[[], records.Snapshot]  # the handle's record snapshot


@dataclass
class Epoch:
    """An epoch in progress: its number, the rest of its batches and where it stands."""

    number: int
    batches: Iterator[Any]
    cursor: Cursor
    total: int | None
    start_rng: rng.RngState | None  # every generator when it began (with every_steps only)
    clock: float  # when its last point ended (or it began)


def next_epoch(n: Trainee) -> int:
    """The epoch the handle trains next: the one in progress after a mid-epoch point."""
    return n.epoch if n.batch is not None else n.epoch + 1


def open_epoch(n: Trainee, resumption: Resumption) -> Epoch:
    """The epoch to train: the one a mid-epoch record was written in, or a mid-epoch point
    stopped this handle in (then the generators go back to that point only now, after the
    split is positioned), or a new one."""
    split = n.data["train"]
    total = epoch_length(split)
    if resumption.position is not None:
        at, resumption.position = resumption.position, None
        batches, cursor = position.reopen(split, at, n.epoch, n.device)
        assert resumption.start_rng is not None  # a resume keeps the record's state until now
        rng.restore(*resumption.start_rng)
        resumption.start_rng = None
        return Epoch(n.epoch, batches, cursor, total, at.epoch_rng, time.monotonic())
    mid_epoch = n.checkpointer is not None and n.checkpointer.every_steps is not None
    sharding.start_epoch(split, n.epoch + 1)  # a DistributedSampler's order depends on it
    start_rng = rng.capture() if mid_epoch else None  # before the split draws its order
    return Epoch(
        n.epoch + 1, iter(split), Cursor.start(n.device), total, start_rng, time.monotonic()
    )


def run_epoch(n: Trainee, parts: Parts, hooks: StepHooks, on_point: OnPoint | None) -> None:
    """Train (the rest of) an epoch, with its points; the last is its end, unless a
    mid-epoch point stopped the run."""
    epoch = open_epoch(n, parts.resumption)
    hooks.every_steps = n.checkpointer.every_steps if n.checkpointer is not None else None
    hooks.point = lambda cursor, step: point(n, parts, epoch, step, on_point)
    hooks.hold = lambda: position.hold(n.data["train"])  # a look-ahead's point records this
    # optimizer steps over the train split
    _, n.step = train_epoch(
        n.experiment, parts.forward_model, n.optimizer, epoch.batches, n.device, hooks,
        epoch.number, n.step, epoch.cursor, epoch.total,
    )  # fmt: skip
    hooks.point = None  # the epoch's iterator (and a loader's workers) ends with it
    if epoch.cursor.stopped:  # a later train() of this handle continues the epoch from here
        split, epoch.batches = n.data["train"], iter(())
        held = epoch.cursor.held  # the state before a look-ahead read, if the point made one
        data = None
        if position.stateful(split):
            data = held.data if held is not None else split.state_dict()
            split.load_state_dict(data)  # drops its live iterator (a loader's workers) now
        assert epoch.start_rng is not None  # a mid-epoch point implies every_steps
        cursor = epoch.cursor
        resumption = parts.resumption
        resumption.position = Position(cursor.batches, cursor.loss_sum, epoch.start_rng, data)
        resumption.start_rng = held.rng if held is not None else rng.capture()
        return
    point(n, parts, epoch, n.step, on_point, end=True)


def point(
    n: Trainee, parts: Parts, epoch: Epoch, step: int, on_point: OnPoint | None, end: bool = False
) -> bool:
    """One checkpoint point; returns whether the run stops here."""
    cursor = epoch.cursor
    batch = None if end else cursor.batches
    where = f"epoch {epoch.number}" + ("" if end else f" batch {batch}")
    if parts.writer is not None:  # one write in flight: its error, if any, is raised here
        parts.writer.wait(f"The checkpoint point at {where} (step {step})")  # on every rank
    if not end:  # the epoch end was checked by the loop
        accumulate = n.stepper.accumulate if n.stepper is not None else 1
        check_finite(
            cursor, epoch.number, step, accumulate, n.dist.gather if n.dist.active else None
        )
    n.step, n.epoch, n.batch = step, epoch.number, batch
    # validate, then check what is watched (a missing or NaN monitor raises here)
    metrics = n.validate() if n.ranking.has_val else {}
    if metrics:
        name = type(n.experiment).__name__
        ranking.check_metrics(name, metrics, n.ranking, epoch.number, batch, step)
    accumulate = n.stepper.accumulate if n.stepper is not None else 1
    every = n.checkpointer.every_steps if n.checkpointer is not None else None
    done = epoch.total if end else cursor.batches
    ahead = budget.next_point(step, done or 0, epoch.total, accumulate, every)
    n.stop_reason = parts.decide_stop(metrics, ahead)
    # log, then checkpoint (the record holds the logger's offset after this row)
    row: dict[str, Any] = {"epoch": epoch.number}
    if batch is not None:
        row["batch"] = batch
    row.update(
        step=step,
        train_loss=n.dist.mean(cursor.mean_loss()),  # over the ranks' shares
        lr=n.optimizer.param_groups[0]["lr"],
        val=metrics,
        seconds=round(time.monotonic() - epoch.clock, 4),
    )
    n.history.append(row)
    n.logger.log({"run": n.run_id, **row})
    # every rank's generators and data state, for rank 0's record
    others = _rank_states(n, epoch, batch) if n.checkpointer is not None else None
    score = metrics.get(n.ranking.pair[0]) if n.ranking.pair[0] else None
    if parts.writer is not None:  # every rank's: rank 0 commits, and writes what it alone writes
        parts.writer.save(
            epoch.number,
            step,
            score,
            n.stop_reason,
            lambda: snapshot(n, parts, epoch, batch, others),
            batch,
        )
    if end:
        parts.progress.epoch_end(setup.summary(row))
    epoch.clock = time.monotonic()
    if on_point is not None:
        on_point({**row, "val": dict(metrics)})  # the history's row stays as the record has it
    return n.stop_reason is not None


def _rank_states(n: Trainee, epoch: Epoch, batch: int | None) -> list[ranks.RankState] | None:
    """Every rank's generators and data state, gathered (a collective: every rank calls it
    at every point), or None in one process."""
    if not n.dist.active:
        return None
    held = epoch.cursor.held  # the point read a batch ahead: the state before that read
    json_state, tensors = held.rng if held is not None else rng.capture()
    split = n.data["train"]
    data = None
    if batch is not None and position.stateful(split):
        data = held.data if held is not None else split.state_dict()
    mid_epoch = batch is not None
    mine = ranks.RankState(
        rng=json_state,
        rng_tensors=dict(tensors),
        epoch_rng=epoch.start_rng if mid_epoch else None,
        data=data,
        # this rank's running sum: the rest of the epoch's train_loss rows add to it
        loss_sum=float(epoch.cursor.loss_sum.detach().item()) if mid_epoch else None,
    )
    states: list[ranks.RankState] = n.dist.gather(mine)
    return states


def _warn_unstored(resumption: Resumption, split: Any, why: str) -> None:
    """Say once per handle that its mid-epoch records hold no data position, and why."""
    if resumption.unstored_warned:
        return
    resumption.unstored_warned = True
    warnings.warn(
        f"Mid-epoch records of this run hold no position of the train split "
        f"({type(split).__name__}): {why} Until then a resume from a mid-epoch record replays "
        "the epoch's consumed batches from its start (read again and skipped, as long as "
        "reading them took) instead of costing O(1).",
        NitroWarning,
        stacklevel=2,
    )


def snapshot(
    n: Trainee,
    parts: Parts,
    epoch: Epoch,
    batch: int | None,
    others: list[ranks.RankState] | None = None,
) -> records.Snapshot:
    """The handle's record snapshot, with where the epoch stands when it is mid-epoch (and,
    from several processes, every rank's generators and data state)."""
    snap = parts.snapshot()
    snap.header["batch"] = batch
    snap.header["position"] = None
    if batch is not None:
        assert epoch.start_rng is not None  # captured whenever every_steps is set
        held = epoch.cursor.held  # the point read a batch ahead: the state before that read
        if held is not None:
            snap.header["rng"], snap.rng_tensors = held.rng[0], dict(held.rng[1])
        snap.header["position"], tensors = position.header(epoch.cursor, epoch.start_rng)
        snap.rng_tensors = {**snap.rng_tensors, **tensors}
        split = n.data["train"]
        if position.stateful(split):
            state = held.data if held is not None else split.state_dict()
            why = position.unstorable(state)
            if why is None:
                snap.trees["data"] = state
            else:  # replayed on a resume, as a split without state_dict() is
                snap.header["position"]["unstored"] = why
                _warn_unstored(parts.resumption, split, why)
    if others is not None:
        extra: dict[str, Any] = {}
        ranks.attach(snap.header, extra, others)
        snap.rng_tensors = {
            **snap.rng_tensors,
            **{k.removeprefix("rng/"): v for k, v in extra.items()},
        }
    return snap
