"""What a handle holds, built at construction: one function per phase of ``Nitro(...)``.

Each takes plain values (the experiment, the run directory, the process group, the seed)
and returns what the handle keeps, refusing at setup what could never train: the
experiment's checkpointer, where the run lives (directory, device, process group, step
settings), the record a resume continues and the run's seed and id, the data and model with
its optimizer and step, the schedule, the weight trackers (EMA, decay anchor), the watchers
(ranking, early stopping, plateau), the logger and the record writer. The handle
(:mod:`nitro_core.training.handle`) calls them in order and holds the results.
"""

from __future__ import annotations

import re
import secrets
import warnings
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import torch

from nitro_core.errors import CheckpointerFix, ConfigError, NitroWarning
from nitro_core.experiment import Experiment, changed_fields, check_required_hooks, config_of
from nitro_core.policy import ranked
from nitro_core.policy.selectors import Checkpointer
from nitro_core.sources.grammar import HF_PREFIX, Source
from nitro_core.state import rng
from nitro_core.state.anchor import W0Anchor
from nitro_core.state.ema import EMA, EMATracker
from nitro_core.store.run import RunStore
from nitro_core.training import distributed, ranking, setup, sharding
from nitro_core.training.checkpointing import OneFile, RecordWriter
from nitro_core.training.distributed import Dist
from nitro_core.training.loggers import Logger, MutedLogger, choose_logger
from nitro_core.training.resume import ResumePoint
from nitro_core.training.sharded_save import RecordDirectory
from nitro_core.training.step import Stepper, StepSettings, split_compiled, step_settings
from nitro_core.training.stopping import EarlyStopper, EarlyStopping, Plateau


class Place(NamedTuple):
    """Where the run lives, on which device, in which process group, with which step."""

    store: RunStore  # its records are written in store.local (on object storage: staging)
    dist: Dist
    device: torch.device
    step_settings: StepSettings


class Identity(NamedTuple):
    """The run's seed and id (a resumed record's, or new ones) and what it branched from."""

    seed: int
    run_id: Any  # rank 0's, broadcast to every rank
    parent: str | None


class Training(NamedTuple):
    """The data splits (each rank's share), the model and its optimizer and step."""

    data: dict[str, Any]
    model: torch.nn.Module  # records go through the uncompiled module
    eval_model: torch.nn.Module  # evaluation's forward passes (compiled, never DDP's)
    forward_model: torch.nn.Module  # training's forward passes (DDP's wrapper, compiled)
    optimizer: torch.optim.Optimizer
    stepper: Stepper | None  # None: the plain step


class Trackers(NamedTuple):
    """What follows the weights step by step: the EMA and the decay anchor."""

    ema: EMATracker | None
    anchor: W0Anchor | None


class Watchers(NamedTuple):
    """What watches the points: the ranking, early stopping, the plateau schedule."""

    ranking: ranking.Ranking
    early_stopper: EarlyStopper | None
    plateau: Any | None


def check_experiment(experiment: Experiment) -> Checkpointer | None:
    """The experiment's checkpointer hook, once the experiment is one with its hooks."""
    if not isinstance(experiment, Experiment):
        raise ConfigError(
            f"Nitro(experiment=...) got {type(experiment).__name__}; pass an instance of an "
            "Experiment subclass, e.g. Nitro(Regression(hidden=64))."
        )
    check_required_hooks(experiment)
    ckpt = experiment.checkpointer()
    if ckpt is not None and not isinstance(ckpt, Checkpointer):
        raise ConfigError(
            f"{type(experiment).__name__}.checkpointer() returned {ckpt!r}; return ",
            CheckpointerFix("keep=..."),
            " or None.",
        )
    return ckpt


def location(
    experiment: Experiment, ckpt: Checkpointer | None, run_dir: str | Path | None
) -> RunStore:
    """Where the run lives: its run directory, on a disk or on object storage."""
    return setup.run_store(run_dir, ckpt, type(experiment).__name__)


def place(
    experiment: Experiment, where: RunStore, device: str | torch.device, strategy: str
) -> Place:
    """Where the run lives (:func:`location`), on which device, in which process group."""
    chosen = setup.resolve_device(device)
    # "auto" and "cuda" leave the GPU to the rank (cuda:LOCAL_RANK); "cuda:1" pins it
    dist, on = distributed.join(strategy, chosen, requested=chosen.index is not None)
    return Place(where, dist, on, step_settings(experiment, on))


def warn_nothing_to_resume(resume: Any, point: ResumePoint | None, run_dir: Path) -> None:
    """``resume='auto'`` in a directory with nothing to resume starts fresh, and says so."""
    if resume == "auto" and point is None:
        warnings.warn(
            f"resume='auto' found nothing to resume in {str(run_dir)!r}; starting a fresh run.",
            NitroWarning,
            stacklevel=3,
        )


def name_run(
    point: ResumePoint | None, seed: int | None, experiment: Experiment, where: Place
) -> Identity:
    """The seed and the run id: a resumed record's, or new ones."""
    if point is not None:
        seed = check_resumable(point, seed, experiment, where)
    checked = setup.check_seed(seed)
    # every rank writes under rank 0's id
    run_id = where.dist.broadcast(
        point.continue_run if point and point.continue_run else secrets.token_hex(4)
    )
    parent = point.parent if point else None
    if point is not None and point.continue_run is None:
        warnings.warn(
            f"Resuming {point.file!r} (epoch {point.meta['epoch']} of run "
            f"{point.meta.get('run')}), which is not its run's latest record in "
            f"{str(where.store)!r}: this branches into a new run {run_id} with parent "
            f"{parent}; the original run's later epochs stay untouched.",
            NitroWarning,
            stacklevel=3,
        )
    return Identity(checked, run_id, parent)


def check_resumable(
    point: ResumePoint, seed: int | None, experiment: Experiment, where: Place
) -> int:
    """Refuse a resume that could not be exact (a weights-only record is the plan's
    refusal, :mod:`nitro_core.training.plan`); returns the recorded seed."""
    point.check_config(experiment)
    point.check_step(experiment, where.step_settings)
    if seed is not None and seed != point.seed:
        warnings.warn(
            f"seed={seed} ignored: resuming {point.file!r} restores its recorded seed "
            f"{point.seed}. Drop the seed keyword, or start a new run_dir to use seed={seed}.",
            NitroWarning,
            stacklevel=4,
        )
    point.check_environment(torch.get_num_threads(), where.device)
    return point.seed


def training(experiment: Experiment, where: Place, seed: int, restoring: bool = False) -> Training:
    """The data splits (each rank's share), the model and its optimizer and step.
    ``restoring``: a resume will load every parameter and buffer from its record, so the
    model's own initialization is skipped where that is safe (:func:`model_to_restore`)."""
    dist, device, settings = where.dist, where.device, where.step_settings
    data = sharding.shard_splits(
        setup.build_splits(experiment), dist, seed, type(experiment).__name__
    )
    # records go through the uncompiled module; forward passes through the compiled one,
    # and training's through DDP when there is one (evaluation bypasses it: it syncs
    # nothing, and ranks may evaluate unequal shares)
    fresh = model_to_restore(experiment, device) if restoring and dist.world == 1 else None
    made = fresh if fresh is not None else experiment.build_model().to(device)
    built = distributed.shard_model(made, dist)
    model, eval_model = split_compiled(built, settings.compile)
    forward_model = distributed.wrap(model, eval_model, dist)
    optimizer = experiment.build_optimizer(model)
    stepper = None if settings.plain else Stepper(settings, optimizer, device)
    return Training(data, model, eval_model, forward_model, optimizer, stepper)


def model_to_restore(experiment: Experiment, device: torch.device) -> torch.nn.Module | None:
    """The experiment's model with its storage allocated but not initialized, for a resume
    that overwrites every parameter and buffer from its record: built on the meta device,
    then given empty storage on ``device``, so a large model's random initialization (most
    of a resume's setup before its first read) is not paid for weights about to be replaced.
    The meta build moves no random generator, so a build as usual after it draws what the
    original run drew. None, for that build, when the record would not restore the model
    whole (:func:`_whole_in_a_record`), when the build needs real tensors (a download,
    ``.cuda()``), or with a decay anchor at the initial weights (``decay_anchor() == "w0"``
    checks them)."""
    if experiment.decay_anchor() != "zero":
        return None
    try:
        with rng.isolated(), torch.device("meta"):
            model = experiment.build_model()
        if not isinstance(model, torch.nn.Module) or not _whole_in_a_record(model):
            return None  # (a build that returns no module is refused by the usual one)
        return model.to_empty(device=device)
    except Exception:  # noqa: BLE001 - builds as usual, which raises whatever is really wrong
        return None


_MODULE_STATE = frozenset({"_parameters", "_buffers", "_modules"})


def _whole_in_a_record(model: torch.nn.Module) -> bool:
    """Whether every tensor of ``model`` is a parameter or buffer a record holds once: none
    shared between two names (tied weights, which ``to_empty`` would untie), none lazy, no
    non-persistent buffer, and no tensor kept elsewhere in a module (an attribute, or in a
    list, tuple, set or dict of one)."""
    named = [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]
    if len({id(t) for _, t in named}) != len(named):
        return False
    for module in model.modules():
        if module._non_persistent_buffers_set:  # noqa: SLF001 - torch keeps no public view
            return False
        if any(torch.nn.parameter.is_lazy(p) for p in module._parameters.values() if p is not None):  # noqa: SLF001
            return False
        if any(_holds_tensor(v) for k, v in vars(module).items() if k not in _MODULE_STATE):
            return False
    return True


def _holds_tensor(value: Any, depth: int = 0) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if depth < 3 and isinstance(value, list | tuple | set | frozenset):
        return any(_holds_tensor(v, depth + 1) for v in value)
    if depth < 3 and isinstance(value, dict):
        return any(_holds_tensor(v, depth + 1) for v in value.values())
    return False


def schedule(
    experiment: Experiment, optimizer: torch.optim.Optimizer, train: Any, settings: StepSettings
) -> Any:
    """The experiment's learning-rate schedule over the run's optimizer steps, or None."""
    steps = (
        experiment.max_epochs * settings.steps_per_epoch(len(train))
        if hasattr(train, "__len__")
        else None
    )
    return experiment.lr_scheduler(optimizer, steps)


def trackers(
    experiment: Experiment, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> Trackers:
    """The EMA of the weights and the decay anchor the experiment asks for."""
    name = type(experiment).__name__
    ema = experiment.ema()
    setup.check_kind(name, "ema", ema, EMA)
    tracker = EMATracker(model, ema.decay) if ema is not None else None
    anchor = experiment.decay_anchor()
    if anchor not in ("zero", "w0"):
        raise ConfigError(f"{name}.decay_anchor() returned {anchor!r}; return 'zero' or 'w0'.")
    return Trackers(tracker, W0Anchor(optimizer) if anchor == "w0" else None)


def watchers(
    experiment: Experiment,
    ckpt: Checkpointer | None,
    splits: list[str],
    optimizer: torch.optim.Optimizer,
) -> Watchers:
    """The ranking of the run's points, and the stops and schedule that watch its monitor."""
    name = type(experiment).__name__
    early, plateau = experiment.early_stopping(), experiment.plateau()
    setup.check_kind(name, "early_stopping", early, EarlyStopping)
    setup.check_kind(name, "plateau", plateau, Plateau)
    ranked = ranking.resolve(experiment, ckpt, splits, early, plateau)
    mode = ranked.monitor[1] if ranked.monitor else "min"
    return Watchers(
        ranked,
        EarlyStopper(early, mode) if early is not None else None,
        plateau.build(optimizer, mode) if plateau is not None else None,
    )


def logger(experiment: Experiment, choice: Any, dist: Dist) -> Logger:
    """The run's logger: the one asked for, or the experiment's; muted off rank 0."""
    chosen = choose_logger(experiment, choice)
    if not dist.main:  # rank 0 logs for the run
        return MutedLogger(chosen.backend)
    return chosen


def resume_lineage(point: ResumePoint | None, exp: Experiment) -> dict[str, list[Any]] | None:
    """What a resumed run changed from its parent, for its records' ``parent_diff``. A branch
    is compared with the record it starts from; a continued branch with its parent's config,
    which is the continued record's with the old values of its ``parent_diff`` put back
    (a Host field changed on the way, such as max_epochs, shows its latest value)."""
    if point is None:
        return None
    if point.continue_run is None:
        return changed_fields(point.meta["config"], config_of(exp))
    kept = point.meta.get("parent_diff")
    if not isinstance(kept, dict):  # a run that never branched
        return None
    parent = {**point.meta["config"], **{name: old for name, (old, _) in kept.items()}}
    return changed_fields(parent, config_of(exp))


_COMPONENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")


def components(experiment: Experiment, data: dict[str, Any]) -> dict[str, Any]:
    """The experiment's own stateful components (``Experiment.stateful``), checked: a dict
    of names to objects with ``state_dict()`` and ``load_state_dict()``."""
    name = type(experiment).__name__
    found = experiment.stateful(data)
    if not isinstance(found, dict):
        raise ConfigError(
            f"{name}.stateful() returned {type(found).__name__}; return a dict of names to "
            "objects with state_dict() and load_state_dict(), e.g. {'curriculum': sampler}, "
            "or {} for none."
        )
    for key, component in found.items():
        if not isinstance(key, str) or not _COMPONENT.fullmatch(key):
            raise ConfigError(
                f"{name}.stateful() names a component {key!r}; a name is a word of letters, "
                "digits, '_', '.' and '-' (at most 64), e.g. 'curriculum'."
            )
        missing = [
            m
            for m in ("state_dict", "load_state_dict")
            if not callable(getattr(component, m, None))
        ]
        if missing:
            raise ConfigError(
                f"{name}.stateful()[{key!r}] is a {type(component).__name__}, which has no "
                f"{' and no '.join(missing)}(); give it state_dict() and "
                "load_state_dict(state) (torch's Stateful), so a resume can put its state back."
            )
    return dict(found)


def weights_lineage(
    trained_under: dict[str, Any] | None, exp: Experiment
) -> dict[str, list[Any]] | None:
    """What a ``weights=`` run changed from the config its weights were trained under."""
    return None if trained_under is None else changed_fields(trained_under, config_of(exp))


def weights_parent(
    source: Source | None,
    loaded: Path | str | None,
    run: str | None,
    averaged_from: dict[str, Any] | None,
) -> str | None:
    """What a run started with ``weights=`` branched from, for its entries' ``parent``:
    '<run>/<file>' of the record loaded (``run``: the one its header names), or
    '<run> => Average(...)' for an average."""
    averaged = source.averaged() if source is not None else None
    if averaged is not None and averaged_from:
        return f"{averaged_from['run']} => {averaged}"
    if loaded is None or source is None:
        return None
    if source.hf_directory() is not None:  # no record header: the directory it came from
        return f"{HF_PREFIX}{loaded}"
    return f"{run or '?'}/{PurePosixPath(loaded).name}"  # a path, or an object's URL


def record_writer(
    ckpt: Checkpointer | None,
    where: Place,
    run_id: str,
    pair: ranked.Pair,
    parent: str | None,
    since: int = 0,
) -> RecordWriter | None:
    """The run's record writer, on every rank (FSDP: each writes its shards; DDP: rank 0
    writes, every rank agrees on errors), or None when the experiment keeps no records;
    ``since``: the step the handle starts at (a resumed record's, or 0)."""
    if ckpt is None:
        return None
    dist = where.dist
    fmt = (
        RecordDirectory(dist, ckpt.async_write, where.store, run_id)
        if dist.strategy == "fsdp"
        else OneFile(ckpt.async_write)
    )
    return RecordWriter(where.store, ckpt, run_id, pair, parent, dist, fmt, since)
