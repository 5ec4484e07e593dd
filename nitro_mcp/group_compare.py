"""``nitro_compare(group=..., baseline=...)``: a seed group's final records metric by metric,
as a mean, a standard deviation and a count, and the difference from a baseline in units
of the baseline's spread.

Each run counts once, by the metrics of its last record that was validated (the record's
own ``metrics``, as ``nitro_checkpoint_info`` shows them). A group is compared once every
one of its jobs has ended; a job that did not succeed, or wrote no validated record, is left
out and named. Groups scored differently are refused, naming the difference: another
ranked metric or set of metrics, or another budget (``max_epochs``, and the ``max_steps``
and ``time_limit`` the records were written under). Training validates on the ``val``
split, so every record compared here was scored on it.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nitro_core.errors import CheckpointNotFound, ConfigError, NitroError
from nitro_core.jobs.groups import MAX_SEEDS, Group, ended, finished, is_group_id, member_statuses
from nitro_core.store import manifest
from nitro_core.store.manifest import Manifest
from nitro_core.store.record_header import read_header
from nitro_mcp import catalog, models, seed_groups
from nitro_mcp.echo import clip
from nitro_mcp.following import follow_call
from nitro_mcp.gate import Gate
from nitro_mcp.paths import shown
from nitro_mcp.replies import REPLY_MAX, shrink

SIDE_BY_SIDE = 4  # runs of each side shown in full beside the spread
NOISE = 2.0  # below this many of the baseline's standard deviations: within noise
EXAMPLE = "e.g. nitro_compare(group='group-20261206-211900-a1b2c3', baseline='runs/Classifier')"


@dataclass(frozen=True)
class Scored:
    """One run's last validated record, as the comparison reads it."""

    directory: Path
    run: str
    source: str  # '<run_dir>:<run id>'
    metrics: dict[str, float]
    ranked: tuple[Any, Any]  # (metric, mode)
    budget: tuple[Any, Any]  # (max_epochs, the record's budget)


Candidate = tuple[str, Path, str, Manifest | None]  # label, run directory, run id, manifest


@dataclass(frozen=True)
class Side:
    name: str  # the group id or the baseline as sent
    runs: list[Scored]
    left_out: list[str]


def compare(gate: Gate, group_id: str, baseline: str | None) -> models.CompareResult:
    """The group ``group_id`` metric by metric, against ``baseline`` (a group id or run
    directory, ``'runs/a:all'`` for each of its runs) when given."""
    group = _group_side(gate, group_id, "group")
    base = None
    if baseline is not None:
        base = (
            _group_side(gate, baseline, "baseline")
            if is_group_id(baseline)
            else _run_side(gate, baseline)
        )
    _check_alike(group, "group")
    if base is not None:
        _check_alike(base, "baseline")
        _check_comparable(group, base)
    ranked = group.runs[0].ranked[0]
    names = sorted(group.runs[0].metrics, key=lambda k: (k != ranked, k))
    spreads = [_spread(name, group, base) for name in names]  # the verdict weighs every one
    comparison = models.GroupComparison(
        group=group.name, baseline=baseline, runs=[r.source for r in group.runs],
        baseline_runs=[r.source for r in base.runs] if base else [],
        metrics=spreads[: catalog.SHOWN_METRICS], metrics_omitted=max(0, len(spreads) - catalog.SHOWN_METRICS),
        left_out=group.left_out + (base.left_out if base else []), note=_note(group, base, spreads),
    )  # fmt: skip
    shown_runs = group.runs[:SIDE_BY_SIDE] + (base.runs[:SIDE_BY_SIDE] if base else [])
    side = catalog.side_by_side(gate.root, [(r.directory, r.run) for r in shown_runs])
    result = side.model_copy(update={
        "spread": comparison,
        "next": "runs shows the first runs of each side in full; nitro_history(run_dir=..., "
        "run=...) a run's curves; nitro_export writes a record's weights out.",
    })  # fmt: skip
    return _bounded(result)


def _bounded(result: models.CompareResult) -> models.CompareResult:
    """The reply within ``REPLY_MAX``: the runs shown in full go first, then the config
    difference; then the lists of the spread are cut, saying how many were left out."""
    while _size(result) > REPLY_MAX - 500 and result.runs:
        result.runs.pop()
        result.config_diff = {k: v[: len(result.runs)] for k, v in result.config_diff.items()}
    if _size(result) > REPLY_MAX - 500:
        result.config_diff_omitted += len(result.config_diff)
        result.config_diff = {}
    spread = result.spread
    assert spread is not None
    budget = max(200, (REPLY_MAX - 500 - _size(result.model_copy(update={"spread": spread.model_copy(
        update={"runs": [], "baseline_runs": [], "left_out": []})}))) // 3)  # fmt: skip
    for name in ("runs", "baseline_runs", "left_out"):
        setattr(spread, name, shrink(getattr(spread, name), budget))
    return result


def _size(result: models.CompareResult) -> int:
    return len(result.model_dump_json())


def _group_side(gate: Gate, group_id: str, what: str) -> Side:
    if not is_group_id(group_id):
        raise ConfigError(
            f"{what}={clip(group_id)} is not a group id; nitro_train(seeds=[0, 1, 2]) starts a "
            f"group and returns its id, {EXAMPLE}."
        )
    group: Group = seed_groups.read(gate, group_id)
    statuses = member_statuses(group, gate.jobs.status)
    if not ended(statuses):
        live = [s.job_id for s in statuses if s.state in ("queued", "running")]
        raise ConfigError(
            f"{what}={group_id!r} has {len(live)} of {len(statuses)} jobs still queued or "
            f"running ({', '.join(live)}); its spread is known once every seed has ended. Call "
            f"{follow_call(group_id)} until it ends, then compare."
        )
    candidates: list[Candidate] = []
    left_out: list[str] = []
    for seed, status in zip(group.seeds, statuses, strict=True):
        if not finished(status) or status.run_id is None:
            left_out.append(f"{group_id} seed {seed}: job {status.job_id} {status.state}")
        else:
            label = f"{group_id} seed {seed}: run {status.run_id}"
            candidates.append((label, Path(status.run_dir), status.run_id, None))
    return _side(gate, group_id, f"{what}={group_id!r}", candidates, left_out,
                 "nitro_status(job_id=...) of each job says why.")  # fmt: skip


def _run_side(gate: Gate, baseline: str) -> Side:
    if not isinstance(baseline, str):
        raise ConfigError(
            f"baseline={clip(baseline)} is not a baseline; name a group id or a run directory, "
            f"{EXAMPLE}."
        )
    manifests: dict[Path, Manifest] = {}
    directory, run_ids = catalog.run_source(gate.root, baseline, "baseline", manifests)
    if len(run_ids) > MAX_SEEDS:
        raise ConfigError(
            f"baseline={clip(baseline)} names {len(run_ids)} runs; a baseline is one run, a "
            f"group or up to {MAX_SEEDS} runs of one directory. Name a group id, or one run "
            f"('{shown(gate.root, directory)}:<run id>')."
        )
    where = shown(gate.root, directory)
    candidates: list[Candidate] = [
        (f"{where}:{run}", directory, run, manifests[directory]) for run in run_ids
    ]
    return _side(gate, baseline, f"baseline={clip(baseline)}", candidates, [],
                 "Name a run that validated, or a group.")  # fmt: skip


def _side(
    gate: Gate, name: str, sent: str, candidates: list[Candidate], left_out: list[str], why: str
) -> Side:
    """The runs among ``candidates`` that wrote a validated record; the others join
    ``left_out``. None did: refused, saying ``why``."""
    runs = []
    for label, directory, run, current in candidates:
        scored = _scored(gate.root, directory, run, current)
        if scored is None:
            left_out.append(f"{label} wrote no validated record")
        else:
            runs.append(scored)
    if not runs:
        raise CheckpointNotFound(
            f"{sent} has no run with a validated record to compare: {'; '.join(left_out)}. {why}"
        )
    return Side(name, runs, left_out)


def _scored(root: Path, directory: Path, run: str, current: Manifest | None) -> Scored | None:
    """The run's last record holding validation metrics (None when it wrote none)."""
    current = manifest.load(directory) if current is None else current
    for entry in reversed(manifest.run_entries(current.entries, run)):
        try:
            meta = read_header(directory / entry.file)
        except (NitroError, OSError):
            continue
        metrics = meta.get("metrics")
        if not isinstance(metrics, dict) or not metrics:
            continue
        recorded = meta.get("config")
        config: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        return Scored(
            directory=directory, run=run, source=f"{shown(root, directory)}:{run}",
            metrics={k: float(v) for k, v in metrics.items() if isinstance(v, int | float)},
            ranked=(meta.get("metric"), meta.get("mode")),
            budget=(config.get("max_epochs"), json.dumps(meta.get("budget"), sort_keys=True)),
        )  # fmt: skip
    return None


def _budget_text(budget: tuple[Any, Any]) -> str:
    max_epochs, recorded = budget
    extra = json.loads(recorded) or {}
    parts = [f"max_epochs={max_epochs}"] + [f"{k}={v}" for k, v in extra.items() if v is not None]
    return ", ".join(parts)


def _check_alike(side: Side, what: str) -> None:
    """Every run of one side scored alike (a run directory's runs may not be)."""
    first = side.runs[0]
    for run in side.runs[1:]:
        for name, mine, theirs in _differences(first, run):
            raise ConfigError(
                f"{what}={clip(side.name)}: its runs {first.source} and {run.source} were "
                f"scored under different {name} ({mine} vs {theirs}), so they are no sample "
                "of one setting; compare runs trained alike, e.g. one group."
            )


def _check_comparable(group: Side, base: Side) -> None:
    for name, mine, theirs in _differences(group.runs[0], base.runs[0]):
        raise ConfigError(
            f"group={group.name!r} and baseline={clip(base.name)} were scored under different "
            f"{name} ({mine} vs {theirs}), so their spreads do not compare. Compare against a "
            f"baseline trained under the same {name}, e.g. a group started with the same "
            "call but for the change you test."
        )


def _differences(a: Scored, b: Scored) -> list[tuple[str, str, str]]:
    out = []
    if a.ranked != b.ranked:
        out.append(
            ("ranked metrics", f"{a.ranked[0]} ({a.ranked[1]})", f"{b.ranked[0]} ({b.ranked[1]})")
        )
    if sorted(a.metrics) != sorted(b.metrics):
        out.append(("metrics", ", ".join(sorted(a.metrics)), ", ".join(sorted(b.metrics))))
    if a.budget != b.budget:
        out.append(("budgets", _budget_text(a.budget), _budget_text(b.budget)))
    return out


def _stats(values: list[float]) -> tuple[float | None, float | None, int]:
    """Mean, sample standard deviation and n of the finite values (a NaN or an infinity
    is no sample of a metric's noise)."""
    values = [v for v in values if math.isfinite(v)]
    std = statistics.stdev(values) if len(values) > 1 else None
    return (statistics.fmean(values) if values else None), std, len(values)


def _spread(name: str, group: Side, base: Side | None) -> models.MetricSpread:
    mean, std, n = _stats([r.metrics[name] for r in group.runs])
    spread = models.MetricSpread(metric=name, mean=mean, std=std, n=n)
    if base is None:
        return spread
    b_mean, b_std, b_n = _stats([r.metrics[name] for r in base.runs])
    difference = None if mean is None or b_mean is None else mean - b_mean
    # no spread (one run, or runs that agree exactly): no noise floor to measure against
    sigmas = None if difference is None or not b_std else difference / b_std
    within = None if sigmas is None else abs(sigmas) < NOISE
    return spread.model_copy(update={
        "baseline_mean": b_mean, "baseline_std": b_std, "baseline_n": b_n,
        "difference": difference, "sigmas": sigmas, "within_noise": within,
    })  # fmt: skip


def _note(group: Side, base: Side | None, spreads: list[models.MetricSpread]) -> str:
    text = (
        f"Each run counts by its last validated record; std is the sample standard deviation "
        f"(n - 1) over {len(group.runs)} run{'s' * (len(group.runs) != 1)} of {group.name}."
    )
    if base is None:
        return text + " Send baseline='<group id or run_dir>' for the difference from it."
    if len(base.runs) < 2:
        return text + (
            " The baseline is one run, so it has no spread and no difference is called "
            "within noise or not: train it as a group, nitro_train(..., seeds=[0, 1, 2])."
        )
    flat = [s.metric for s in spreads if s.baseline_std == 0]
    if flat:
        text += (
            f" The baseline's runs agree exactly on {', '.join(flat)} (std 0): no noise floor, "
            "so no difference there is called within noise or not; check that its runs were "
            "trained with different seeds."
        )
    ranked, mode = group.runs[0].ranked

    def named(s: models.MetricSpread) -> str:
        if s.metric != ranked or mode not in ("min", "max") or s.difference is None:
            return s.metric
        better = (s.difference < 0) == (mode == "min")
        return f"{s.metric} ({'better' if better else 'worse'}, ranked {mode})"

    beyond = [named(s) for s in spreads if s.within_noise is False]
    verdict = (
        f"beyond noise (|sigmas| >= {NOISE:g}): {', '.join(beyond)}" if beyond
        else f"every metric is within noise (|sigmas| < {NOISE:g})"
    )  # fmt: skip
    return f"{text} Against {base.name}: {verdict}."


__all__ = ["NOISE", "compare"]
