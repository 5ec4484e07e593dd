"""The pre-flight of a training, written once: :func:`plan` checks what a call asks for from
the values, the manifest and the record headers alone, and never builds a model or calls an
experiment's hooks.

The MCP gate calls it before it submits a job (a refusal comes back at once, as the
call's error); the handle (``Nitro(...)``) starts from the same :class:`Plan`, then does
what needs the experiment's code: its hooks, the model, the data, the record loaded into
them (DESIGN section 16). What it checks, in order: the budget, the loading options, the
seed, the device, the run directory's manifest, and the record a resume continues (its
header: read by ranged reads on object storage, the record itself never fetched here),
refused when it holds weights only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from nitro_core.sources.grammar import Source
from nitro_core.store.manifest import ManifestEntry
from nitro_core.store.run import RunStore, open_run
from nitro_core.training.budget import Budget, check_budget
from nitro_core.training.options import LoadOptions, check_options
from nitro_core.training.resume import ResumePoint, latest_point, resume_from_source
from nitro_core.training.setup import check_seed, resolve_device


@dataclass(frozen=True)
class Plan:
    """What a training call resolved to before anything is built: its options, where its
    run lives, what the manifest lists, the record a resume continues (header read, not
    fetched) and its budget."""

    options: LoadOptions
    store: RunStore  # where the run lives
    entries: list[ManifestEntry]
    point: ResumePoint | None
    budget: Budget
    seed: int | None  # as asked (a resume takes its record's)

    def fetched_point(self) -> ResumePoint | None:
        """The resume point with its record readable here (:meth:`RunStore.fetch`: on
        object storage, the listed record copied down, checked against the manifest)."""
        point = self.point
        if point is None or point.entry is None or point.path.exists():
            return point
        if not self.store.holds(point.path):  # another run directory's record: read already
            return point
        return replace(point, path=self.store.fetch(point.entry))


def plan(
    where: RunStore | str | Path,
    *,
    resume: Any = False,
    weights: Any = None,
    restore_optimizer: bool = False,
    restore_best: Any = False,
    load_ema: bool = False,
    strict: bool = True,
    seed: int | None = None,
    device: Any = "auto",
    max_steps: int | None = None,
    time_limit: float | None = None,
    rooted: Callable[[Source], Source] = lambda source: source,
) -> Plan:
    """Check a training call from its values, manifest and headers; ``rooted`` rewrites the resume source as its
    caller confines sources (the gate: under the server's root). Raises the refusal."""
    check_budget(max_steps, time_limit)
    options = check_options(resume, weights, restore_optimizer, restore_best, load_ema, strict)
    check_seed(seed)
    resolve_device(device)
    store = open_run(where)
    entries = store.entries()
    point = None
    if options.resume == "auto":
        point = latest_point(entries, store, fetch=False) if entries else None
    elif options.resume is not None:
        point = resume_from_source(rooted(options.resume), store, entries, fetch=False)
    if point is not None:
        point.check_resumable()
    return Plan(options, store, entries, point, Budget(max_steps, time_limit), seed)
