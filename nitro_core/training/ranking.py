"""Ranking policy: the monitor, the (metric, mode) pair records are scored under, and every
setup refusal and warning about them (spec: "Which checkpoints a run keeps", "Only the
current metric is ranked").

Names carry no split: ``loss`` is the validation loss the framework supplies when the
experiment defines no metrics (or turns on ``eval_loss``), ``acc`` a custom metric.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nitro_core.errors import CheckpointerFix, ConfigError, MonitorError, NitroWarning
from nitro_core.experiment import Experiment, defines
from nitro_core.policy import retention
from nitro_core.policy.selectors import NAME_PATTERN, Checkpointer, Mode
from nitro_core.store.manifest import ManifestEntry


@dataclass(frozen=True)
class Ranking:
    """What validation reports and what ranks records."""

    monitor: tuple[str, Mode] | None  # None: nothing to rank by
    pair: tuple[str | None, Mode | None]  # what records are scored under
    custom_metrics: bool
    with_loss: bool
    has_val: bool

    @property
    def watched(self) -> set[str]:
        names = {self.pair[0]} if self.pair[0] else set()
        return names | ({self.monitor[0]} if self.monitor else set())


def resolve(
    exp: Experiment,
    ckpt: Checkpointer | None,
    splits: list[str],
    early_stopping: Any,
    plateau: Any,
) -> Ranking:
    """The ranking of a run, refusing at setup what can never work."""
    name = type(exp).__name__
    custom = defines(exp, "metrics")
    with_loss = not custom or bool(exp.eval_loss())
    has_val = "val" in splits
    monitor = _monitor(exp)
    rankable = with_loss or defines(exp, "monitor") or monitor[0] != "loss"
    if ckpt is not None and ckpt.metric is not None:
        pair: tuple[str | None, Mode | None] = (ckpt.metric, ckpt.mode)
    elif rankable:
        pair = monitor
    else:
        pair = (None, None)
    for what, metric in (("monitor()", monitor[0]), ("Checkpointer(metric=)", pair[0])):
        if metric is not None and not NAME_PATTERN.fullmatch(metric):
            raise ConfigError(
                f"{name}.{what} names the metric {metric!r}; metric names take letters, digits and "
                "'_', '.', '+', '-' only (they land in file names), e.g. 'acc' or 'top1_acc'."
            )
    reported = not custom and not defines(exp, "finalize_metrics")  # validation reports only 'loss'
    wanted = {m for m in (pair[0], monitor[0] if defines(exp, "monitor") else None) if m}
    if reported and wanted - {"loss"}:
        bad = sorted(wanted - {"loss"})[0]
        raise ConfigError(
            f"{name} ranks by {bad!r}, but it defines no metrics(), so validation reports only "
            f"'loss'. Define metrics() returning {bad!r} (name -> (sum, count)), or rank by "
            "('loss', 'min')."
        )
    watchers = [
        what
        for what, on in (("EarlyStopping", early_stopping), ("Plateau", plateau))
        if on is not None
    ]
    if not rankable:
        needs = (
            [f"keep={ckpt}"] if ckpt is not None and ckpt.ranks and ckpt.metric is None else []
        ) + watchers
        if needs:
            raise ConfigError(
                f"{name} has nothing to rank by for {' and '.join(needs)}: it defines metrics() "
                "without declaring monitor(), and eval_loss() is off, so no 'loss' is reported. "
                "Declare def monitor(self): return ('acc', 'max') with a key finalize_metrics "
                "returns, turn on def eval_loss(self): return True, or keep only Last(k): ",
                CheckpointerFix("keep=Last(1)"),
                ".",
            )
    if not has_val:
        if ckpt is not None and ckpt.best_only:
            raise ConfigError(
                f"{name} keeps only {ckpt} but build_data() has no 'val' split, so no epoch "
                f"would have a score and nothing would be written. Add a 'val' split, or keep "
                "the latest too: ",
                CheckpointerFix(f"keep=({', '.join(map(str, ckpt.keep))}, Last(1))"),
                ".",
            )
        if watchers:
            raise ConfigError(
                f"{name} uses {' and '.join(watchers)}, which watch the validation monitor, but "
                "build_data() has no 'val' split. Add a 'val' split or remove them."
            )
        ranked = [str(s) for s in (ckpt.keep if ckpt is not None else ()) if s.ranks]
        if ranked:  # with a Last too: it trains and keeps, but never a best
            warnings.warn(
                f"{name} keeps {', '.join(ranked)} but build_data() has no 'val' split, so no "
                "record gets a score: it keeps no best, and restore_best and 'best' sources "
                "find none. Add a 'val' split, or keep only the latest: "
                f"Checkpointer(keep=Last({ckpt.keep_latest if ckpt else 1})).",
                NitroWarning,
                stacklevel=5,
            )
    if ckpt is not None and not ckpt.keep_latest and not ckpt.best_only:
        warnings.warn(
            f"keep={ckpt} has no Last, so an epoch is written only when a selector keeps it: the "
            "state training ends in is saved only if one does, resume='auto' continues from the "
            "latest kept epoch, and a crash loses every epoch since. Add Last(1) to keep the "
            f"latest: Checkpointer(keep=({', '.join(map(str, ckpt.keep))}, Last(1))).",
            NitroWarning,
            stacklevel=5,
        )
    if ckpt is not None and ckpt.best_only:
        warnings.warn(
            f"keep={ckpt} writes an epoch only when it enters the top {ckpt.k}: the state "
            "training ends in is saved only if it ranks, resume='auto' continues from the "
            "latest kept epoch, and a crash loses every epoch since. Add Last(1) to keep the "
            f"latest: Checkpointer(keep=({', '.join(map(str, ckpt.keep))}, Last(1))).",
            NitroWarning,
            stacklevel=5,
        )
    return Ranking(
        monitor=monitor if rankable else None,
        pair=pair,
        custom_metrics=custom,
        with_loss=with_loss,
        has_val=has_val,
    )


def _monitor(exp: Experiment) -> tuple[str, Mode]:
    value = exp.monitor()
    if (
        not isinstance(value, tuple | list)
        or len(value) != 2
        or not isinstance(value[0], str)
        or value[1] not in ("min", "max")
    ):
        raise ConfigError(
            f"{type(exp).__name__}.monitor() returned {value!r}; return a (metric, mode) "
            "pair such as ('acc', 'max') or ('loss', 'min')."
        )
    return (value[0], value[1])


def warn_about_directory(
    entries: list[ManifestEntry],
    ckpt: Checkpointer | None,
    run: str | None,
    ranking: Ranking,
    run_dir: Path,
) -> None:
    """Setup warnings about what the directory already holds."""
    if ckpt is None or not entries:
        return
    if ckpt.scope == "dir":
        others = [e for e in entries if e.pair == ranking.pair and e.run != run]
        if others:
            warnings.warn(
                f"{str(run_dir)!r} already holds {len(others)} checkpoint(s) of other runs scored "
                f"by {ranking.pair[0]} ({ranking.pair[1]}); with scope='dir' this run's writes "
                "may delete them. Use scope='run' (the default) to keep them.",
                NitroWarning,
                stacklevel=4,
            )
    mixed = retention.other_pairs(entries, ckpt, run, ranking.pair)
    if mixed:
        warnings.warn(
            f"{str(run_dir)!r} holds entries scored under other metrics ({retention.describe_pairs(mixed)}) "
            f"beside {ranking.pair[0]} ({ranking.pair[1]}); they are never ranked against "
            "the current metric nor deleted by this run.",
            NitroWarning,
            stacklevel=4,
        )


def check_metrics(
    name: str,
    metrics: dict[str, float],
    ranking: Ranking,
    epoch: int,
    batch: int | None = None,
    step: int | None = None,
) -> None:
    """Refuse a watched metric that validation did not return, or a non-finite one; a
    mid-epoch point (``batch`` set) is named by its epoch, batch and step."""
    point = f"epoch {epoch}" if batch is None else f"epoch {epoch} batch {batch} (step {step})"
    end = f"the end of epoch {epoch}" if batch is None else f"the point at {point}"
    unwritten = f"epoch {epoch}" if batch is None else f"the point at {point}"
    for metric in sorted(ranking.watched):
        if metric not in metrics:
            available = ", ".join(sorted(metrics)) or "(nothing)"
            hint = ""
            for split in ("val_", "validate_", "valid_", "train_"):
                if metric.startswith(split) and metric[len(split) :] in metrics:
                    hint = f" Names carry no split: write {metric[len(split) :]!r}."
            raise MonitorError(
                f"Monitored metric {metric!r} is not a key finalize_metrics returned for 'val' "
                f"at {end}; it returned: {available}.{hint} Return {metric!r} "
                f"from {name}.metrics()/finalize_metrics(), or declare monitor() (or ",
                CheckpointerFix("metric=, mode="),
                ") with one of the returned keys.",
            )
        value = metrics[metric]
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise MonitorError(
                f"Monitored metric {metric!r} is {value!r} on split 'val' at {point}; a "
                f"non-finite score cannot be ranked, so {unwritten} was not written and the "
                "records already on disk are untouched. Lower the learning rate or check the "
                "data, then continue from the last good record with resume='auto'."
            )
