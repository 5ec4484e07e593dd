"""Applying records to a handle: a full resume, a weights load, and ``restore_best``.

A full resume restores everything the next step depends on and refuses, with a diff, what
would make it inexact. A weights load takes parameters and layer state into a new run.
``restore_best`` swaps the run's own best (or averaged) checkpoint in at the end of
``train()`` and then refuses further training.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from nitro_core.averaging import Averaged, average
from nitro_core.errors import (
    WEIGHTS_ONLY,
    CheckpointNotFound,
    ConfigError,
    NitroWarning,
    ResumeRefused,
    TrainingRefused,
    arg,
)
from nitro_core.experiment import Experiment, config_diff
from nitro_core.policy.selectors import Checkpointer
from nitro_core.sources import lookup
from nitro_core.sources.grammar import Average, Pair, RunRef, Source
from nitro_core.sources.resolve import Resolved, pick_best, resolve
from nitro_core.sources.selection import check_keep_holds
from nitro_core.state import ranks, records, rng
from nitro_core.state.anchor import W0Anchor
from nitro_core.state.ema import EMATracker
from nitro_core.state.loading import (
    WEIGHTS,
    fresh_schedule,
    load_model_state,
    read,
    tie_aliases,
)
from nitro_core.store import manifest, shards
from nitro_core.store.manifest import ManifestEntry
from nitro_core.store.run import RunStore
from nitro_core.training import fsdp_state, position
from nitro_core.training.distributed import Dist
from nitro_core.training.loggers import Logger, check_resume_backend
from nitro_core.training.options import LoadOptions
from nitro_core.training.position import Position
from nitro_core.training.ranking import Ranking
from nitro_core.training.resume import ResumePoint
from nitro_core.training.step import Stepper
from nitro_core.training.stopping import EarlyStopper


class Restorable(Protocol):
    """The handle as a restore sees it: public attributes only (``Nitro`` is one)."""

    experiment: Experiment
    checkpointer: Checkpointer | None
    options: LoadOptions
    store: RunStore  # where the run lives
    run_dir: Path  # its records as read here (store.local)
    run_id: str
    seed: int
    dist: Dist
    ranking: Ranking
    data: dict[str, Any]
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    plateau: Any
    stepper: Stepper | None
    components: dict[str, Any]  # Experiment.stateful's, by name
    early_stopper: EarlyStopper | None
    ema: EMATracker | None
    anchor: W0Anchor | None
    logger: Logger
    step: int
    epoch: int
    batch: int | None
    history: list[dict[str, Any]]
    checkpoint_source: Path | str | None  # as its run directory names it (S3: its URL)
    averaged_from: dict[str, Any] | None
    held: Held | None


@dataclass(frozen=True)
class Held:
    """What a handle's model holds after ``restore_best``, as an export names it: the
    record (None: an average of records) and the run, epoch and step it was written at."""

    record: Path | str | None
    run: str
    epoch: int
    step: int


@dataclass(frozen=True)
class Restored:
    """What a full resume leaves for ``train()``, beside the state loaded into the handle."""

    logger_state: dict[str, Any] | None
    start_rng: rng.RngState  # restored when train() starts
    position: Position | None  # a mid-epoch record's: where its epoch stands


def restore_full(n: Restorable, point: ResumePoint) -> Restored:
    """Load the full training state of ``point`` into ``n``; returns the logger state and the
    recorded RNG state, which the handle restores when ``train()`` starts (a draw between
    construction and training must not move the resumed trajectory), and a mid-epoch
    record's data position, for ``train()`` to continue the epoch."""
    _check_anchor(n, point)
    point.check_layout(records.model_layout(n.model, n.optimizer))
    recorded = point.meta.get("logger", {}).get("backend")
    check_resume_backend(point.file, recorded, n.logger.backend, n.experiment)
    if n.dist.strategy == "fsdp" and shards.is_sharded(point.path):  # this rank's pieces
        ema = n.ema.shadow if n.ema is not None else None
        expected = point.entry.expected if point.entry else None
        whole = fsdp_state.read_pieces(n.model, n.optimizer, ema, point.path, expected, n.dist)
    else:
        whole = point.load()
    rec = ranks.view(whole, n.dist.rank)  # this rank's generators and data state
    _warn_world_changed(rec.meta, n, point.file)
    meta = rec.meta
    if n.dist.strategy == "fsdp" and shards.is_sharded(point.path):  # loaded in place
        n.optimizer.load_state_dict(rec.tree("optimizer"))
    elif n.dist.strategy == "fsdp":  # whole tensors, resharded onto this rank's pieces
        fsdp_state.load(n.model, n.optimizer, rec.model_state(), rec.tree("optimizer"), meta)
    else:
        n.model.load_state_dict(rec.model_state())
        n.optimizer.load_state_dict(rec.tree("optimizer"))
    if n.scheduler is not None and meta.get("scheduler") is not None:
        n.scheduler.load_state_dict(rec.tree("scheduler"))
    if n.plateau is not None and meta.get("plateau") is not None:
        n.plateau.load_state_dict(rec.tree("plateau"))
    scaler = n.stepper.scaler if n.stepper is not None else None
    if scaler is not None and meta.get("scaler") is not None:
        scaler.load_state_dict(rec.tree("scaler"))
    if n.early_stopper is not None and meta.get("early_stopping") is not None:
        n.early_stopper.load_state_dict(meta["early_stopping"])
    _load_components(n, rec, point.file)
    ema_state = rec.ema_state()
    if n.ema is not None and ema_state is not None:
        n.ema.load(ema_state, meta["ema_meta"]["num_updates"])
    n.step, n.epoch, n.batch = meta["step"], meta["epoch"], meta.get("batch")
    at = position.read(rec)  # a mid-epoch record: where its epoch stands
    if at is not None:
        position.check_length(at, n.data["train"], n.epoch, point.file)
    n.history = list(meta.get("history", []))
    n.averaged_from = meta.get("averaged_from")
    return Restored(meta["logger"]["state"], (meta["rng"], rec.rng_tensors()), at)


def _load_components(n: Restorable, rec: records.Record, file: str) -> None:
    """The experiment's own components (``Experiment.stateful``) given back their recorded
    states; a record that holds other components than the experiment declares is refused,
    naming both (a resume without a component's state cannot continue exactly)."""
    recorded = rec.tree("stateful") or {}
    if sorted(recorded) != sorted(n.components):
        name = type(n.experiment).__name__
        raise ResumeRefused(
            f"Cannot resume {file!r} exactly: it holds the states of the components "
            f"{sorted(recorded)}, and {name}.stateful() declares {sorted(n.components)}. "
            "Declare the same components the run was trained with, or start a new run from "
            f"its weights: weights={file!r}."
        )
    for key, component in n.components.items():
        component.load_state_dict(recorded[key])


def _warn_world_changed(meta: dict[str, Any], n: Restorable, file: str) -> None:
    """A resume on another number of processes carries the parameters and optimizer state
    over, but cannot be bit-for-bit: say why."""
    recorded = ranks.recorded_world(meta)
    if recorded == n.dist.world:
        return
    warnings.warn(
        f"Resuming {file!r}, written by {recorded} process(es), on {n.dist.world}: the "
        "parameters and optimizer state carry over, but the run cannot continue bit-for-bit: "
        "each rank's share and order of the data differ from the recorded run's, and rank r "
        f"continues with the generators of recorded rank r % {recorded}. Launch with "
        f"torchrun --nproc_per_node {recorded} for an exact resume.",
        NitroWarning,
        stacklevel=5,
    )


def _check_anchor(n: Restorable, point: ResumePoint) -> None:
    recorded = point.meta.get("decay_anchor", "zero")
    current = n.experiment.decay_anchor()
    if recorded != current:
        raise ResumeRefused(
            f"Cannot resume {point.file!r}: it was trained with decay_anchor() == {recorded!r}, "
            f"the experiment now returns {current!r}. Return {recorded!r} from decay_anchor() to "
            "resume, or start a new run that takes only the weights: ",
            WEIGHTS_ONLY,
            ".",
        )
    if current != "w0":
        return
    assert n.anchor is not None  # the handle builds a W0Anchor when decay_anchor() is "w0"
    if point.meta.get("w0_checksum") != n.anchor.checksum:
        raise ResumeRefused(
            f"Cannot resume {point.file!r}: its decay anchor w0 has checksum "
            f"{str(point.meta.get('w0_checksum'))[:12]}..., but build_model() with seed {n.seed} "
            f"now builds initial weights with checksum {n.anchor.checksum[:12]}..., so decay "
            "would pull toward other weights. Restore the initialization the record was trained "
            "with, or start a new run that takes only the weights: ",
            WEIGHTS_ONLY,
            ".",
        )


@dataclass(frozen=True)
class LoadedWeights:
    """What a weights load says of the weights it loaded, from their header."""

    config: dict[str, Any] | None  # the config they were trained under (None: not recorded)
    run: str | None  # the run that wrote them (None: not recorded, e.g. Hugging Face)


def load_weights(n: Restorable, source: Source, entries: list[ManifestEntry]) -> LoadedWeights:
    """Parameters and layer state (or the EMA copy) of ``source`` into a new run. A record
    on object storage is read from a copy of its weights sections alone (with
    ``restore_optimizer``: of all of it)."""
    opts = n.options
    name = type(n.experiment).__name__
    if source.averaged() is not None:
        return load_average(n, source, entries)
    home, _ = lookup.home_of(source, n.store)  # a record named by its URL: its own run
    resolved = lookup.resolve_at(source, n.store, n.ranking.pair, copy=False)
    sections = None if opts.restore_optimizer else WEIGHTS  # optimizer bytes: unread
    rec = read(lookup.copied(home, resolved, sections), sections)
    shown = str(lookup.shown_record(home, resolved.path))  # on object storage its URL
    warn_config_changed(rec.meta, n, shown)
    state = rec.ema_state() if opts.load_ema else rec.model_state()
    if state is None:
        raise ConfigError(
            arg("load_ema", True),
            f", but {shown!r} keeps no EMA (its experiment's ema() returned "
            "None). Drop load_ema to load its parameters.",
        )
    if source.hf_directory() is not None:  # tied aliases are saved once: tie them back
        state = tie_aliases(n.model, state)
    load_model_state(n.model, fsdp_state.placed(n.model, state), opts.strict, shown, name)
    if n.ema is not None:
        n.ema.reset()
    if opts.restore_optimizer:
        if rec.meta.get("optimizer") is None:  # an export or an average: weights only
            raise ConfigError(
                arg("restore_optimizer", True),
                f", but {shown!r} holds weights only (an export or an average), no "
                "optimizer state. Drop restore_optimizer to load its weights with a fresh "
                "optimizer.",
            )
        recorded = rec.meta["layout"]["groups"]
        current = records.model_layout(n.model, n.optimizer)["groups"]
        if recorded != current:
            raise ConfigError(
                arg("restore_optimizer", True),
                f": the optimizer groups of {shown!r} ({recorded}) differ from this "
                f"optimizer's ({current}); the state would land on the wrong parameters. Build "
                "the optimizer with the same groups, or drop restore_optimizer.",
            )
        state = fresh_schedule(n.optimizer, rec.tree("optimizer"))
        if n.dist.strategy == "fsdp":  # each rank takes its pieces of every moment
            fsdp_state.load_optimizer(n.model, n.optimizer, state, rec.meta)
        else:
            n.optimizer.load_state_dict(state)
    n.checkpoint_source = lookup.shown_record(home, resolved.path)
    n.averaged_from = rec.meta.get("averaged_from")
    return LoadedWeights(_recorded_config(rec.meta), rec.meta.get("run"))


def warn_config_changed(meta: dict[str, Any], n: Restorable, origin: str) -> None:
    """A weights load only warns about a changed plain config (the spec): it builds the
    model from the current experiment, so old weights under another graph are allowed."""
    diff = config_diff(meta["config"], n.experiment) if meta.get("config") else []
    if diff:
        warnings.warn(
            f"weights from {origin} were trained under another config:\n"
            + "\n".join(diff)
            + "\nLoading them into the current experiment as asked.",
            NitroWarning,
            stacklevel=6,
        )


def _recorded_config(meta: dict[str, Any]) -> dict[str, Any] | None:
    config = meta.get("config")
    return config if isinstance(config, dict) else None


def average_of(n: Restorable, resolved: Resolved, load_ema: bool = False) -> Averaged:
    """The average ``resolved`` names: read in the run directory, or on object storage from
    copies of the picks' weights alone (never their optimizer state), removed after."""
    with lookup.weights_copies(n.store, resolved, WEIGHTS) as (here, private):
        return average(here, private, load_ema=load_ema, shown=str(n.store))


def shown_dir(n: Restorable) -> str:
    """The run directory as a message names it (on object storage its URL)."""
    return str(n.store)


def load_average(n: Restorable, source: Source, entries: list[ManifestEntry]) -> LoadedWeights:
    """``weights=... => Average(...)``: load the average into a new run."""
    points = n.store.points()
    resolved = resolve(source, n.run_dir, entries, n.ranking.pair, points, shown_dir(n))
    result = average_of(n, resolved, load_ema=n.options.load_ema)
    warn_config_changed(result.meta, n, repr(str(source)))
    state = result.ema if n.options.load_ema else result.state
    assert state is not None  # average() refuses load_ema when a picked record has no EMA
    load_model_state(n.model, state, n.options.strict, str(source), type(n.experiment).__name__)
    if n.ema is not None:
        n.ema.reset()
    n.checkpoint_source = lookup.shown_record(n.store, resolved.path)
    n.averaged_from = result.averaged_from
    return LoadedWeights(_recorded_config(result.meta), result.meta.get("run"))


def restore_average(n: Restorable, avg: Average, entries: list[ManifestEntry]) -> Average | None:
    """``restore_best=Average(...)``: end training holding the run's own average."""
    source = Pair(RunRef("id", n.run_id), avg)
    try:
        resolved = resolve(
            source, n.run_dir, entries, n.ranking.pair, n.store.points(), shown_dir(n)
        )
    except CheckpointNotFound as exc:
        warnings.warn(
            f"restore_best={avg}: run {n.run_id} ended before it held enough checkpoints "
            f"({exc}); the handle keeps its final weights.",
            NitroWarning,
            stacklevel=4,
        )
        return None
    result = average_of(n, resolved)
    n.model.load_state_dict(fsdp_state.placed(n.model, result.state))
    if n.ema is not None:
        if result.ema is not None:
            n.ema.load(result.ema, n.ema.num_updates)
        else:
            warnings.warn(
                f"restore_best={avg}: a picked record of run {n.run_id} keeps no EMA, so the "
                "handle keeps its final EMA beside the averaged weights.",
                NitroWarning,
                stacklevel=4,
            )
    n.averaged_from = result.averaged_from
    n.checkpoint_source = lookup.shown_record(n.store, resolved.path)
    n.held = Held(None, n.run_id, n.epoch, n.step)  # an average: its averaged_from says of what
    return avg


class BestRestorer:
    """``restore_best``: after training, hold the run's own best (or averaged) checkpoint."""

    def __init__(self, n: Restorable, spec: bool | Average) -> None:
        self.n = n
        self.spec = spec
        self.holding: ManifestEntry | Average | None = None
        if spec is not False and n.checkpointer is None:
            raise ConfigError(
                f"restore_best={spec} needs checkpoints, but {type(n.experiment).__name__}."
                "checkpointer() returns None. Return a Checkpointer, or drop restore_best."
            )
        if isinstance(spec, Average):
            check_keep_holds(n.checkpointer, spec, n.experiment.max_epochs)

    def apply(self) -> None:
        if self.spec is False or self.holding is not None:
            return
        n = self.n
        entries = n.store.entries()
        own = manifest.run_entries(entries, n.run_id)
        if isinstance(self.spec, Average):
            self.holding = restore_average(n, self.spec, entries)
            return
        scored = [e for e in own if e.score is not None and e.pair == n.ranking.pair]
        if not scored:
            warnings.warn(
                f"restore_best=True: run {n.run_id} has no scored checkpoint in "
                f"{shown_dir(n)!r}, so the handle keeps its final weights.",
                NitroWarning,
                stacklevel=3,
            )
            return
        source = Pair(RunRef("id", n.run_id), "best")
        best = pick_best(source, own, n.ranking.pair, shown_dir(n))
        resolved = Resolved(source, n.run_dir / best.file, best)
        rec = read(lookup.copied(n.store, resolved, WEIGHTS), WEIGHTS)
        n.model.load_state_dict(fsdp_state.placed(n.model, rec.model_state()))
        ema_state = rec.ema_state()
        if n.ema is not None and ema_state is not None:
            n.ema.load(ema_state, rec.meta["ema_meta"]["num_updates"])
        n.checkpoint_source = n.store.record(best.file)
        n.held = Held(n.checkpoint_source, n.run_id, best.epoch, best.step)
        self.holding = best

    def refuse_training(self) -> None:
        if self.holding is None:
            return
        n = self.n
        exp = f"{type(n.experiment).__name__}(...)"
        where = f"run_dir={shown_dir(n)!r}"
        what = (
            f"best checkpoint (epoch {self.holding.epoch}, {self.holding.metric}={self.holding.score:.6g})"
            if isinstance(self.holding, ManifestEntry)
            else f"average {self.holding}"
        )
        pick = "best" if isinstance(self.holding, ManifestEntry) else self.holding
        raise TrainingRefused(
            f"This handle ended train() holding run {n.run_id}'s {what} rather than its final "
            f"state (epoch {n.epoch}); those weights beside the final optimizer state are not a "
            "state any run was in, so it will not train further. To continue from it, write "
            "one of:\n"
            + (
                f"  Nitro({exp}, {where}, resume='{n.run_id} => best')  # exact: its optimizer, step and RNG, as a new branch\n"
                if isinstance(self.holding, ManifestEntry)
                else ""
            )
            + f"  Nitro({exp}, {where}, weights='{n.run_id} => {pick}')  # its weights, a fresh optimizer and schedule\n"
            + (
                f"  Nitro({exp}, {where}, weights='{n.run_id} => best', restore_optimizer=True)  # its weights and optimizer state, a fresh schedule"
                if isinstance(self.holding, ManifestEntry)
                else f"  Nitro({exp}, {where}, weights='{n.run_id} => {pick}', load_ema=True)  # the average of its EMAs"
            )
        )
