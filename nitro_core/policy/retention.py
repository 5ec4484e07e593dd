"""Retention: which entries a checkpointer keeps and which it deletes, decided from the
manifest alone.

These functions only decide; ``checkpointing.py`` carries the decision out on disk. Only entries
scored under the current (metric, mode) pair, and under ``scope="run"`` only the run's own,
are ever ranked or deleted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from nitro_core.policy.ranked import Pair as Pair
from nitro_core.policy.ranked import ranked
from nitro_core.policy.selectors import Checkpointer
from nitro_core.sources.grammar import parse_keep
from nitro_core.store.manifest import ManifestEntry


@dataclass(frozen=True)
class RetentionPlan:
    """Files kept (each with why) and files to delete."""

    keep: dict[str, tuple[str, ...]]
    delete: tuple[str, ...]


def governed(
    entries: Sequence[ManifestEntry], ckpt: Checkpointer, run: str, pair: Pair
) -> list[ManifestEntry]:
    """The entries this checkpointer may rank and delete."""
    return [e for e in entries if e.pair == pair and (ckpt.scope == "dir" or e.run == run)]


def plan(
    entries: Sequence[ManifestEntry], ckpt: Checkpointer, run: str, pair: Pair
) -> RetentionPlan:
    """Keep the union of the selectors over the governed entries; delete the rest of them."""
    pool = governed(entries, ckpt, run, pair)
    keep = keep_reasons(pool, ckpt, pair)
    return RetentionPlan(
        keep={f: tuple(r) for f, r in keep.items()},
        delete=tuple(e.file for e in pool if e.file not in keep),
    )


def keep_reasons(
    pool: Sequence[ManifestEntry], ckpt: Checkpointer, pair: Pair
) -> dict[str, list[str]]:
    """File -> the selectors that keep it, e.g. ``["Best(3): #1 by acc (max)", "Last(1)"]``."""
    metric, mode = pair
    order = {id(e): i + 1 for i, e in enumerate(ranked(pool, mode))}
    reasons: dict[str, list[str]] = {}
    for sel in ckpt.keep:
        for e in sel.pick(pool, mode):
            reasons.setdefault(e.file, []).append(sel.why(order.get(id(e)), (metric, mode)))
    return reasons


def explain(entries: Sequence[ManifestEntry], run: str) -> dict[str, tuple[str, ...]]:
    """Why each of ``run``'s entries is kept, from the keep its latest entry recorded
    (empty when the run recorded none)."""
    mine = [e for e in entries if e.run == run]
    if not mine or mine[-1].keep is None:
        return {}
    pair = mine[-1].pair
    ckpt = Checkpointer(keep=parse_keep(mine[-1].keep))
    return {
        f: tuple(r)
        for f, r in keep_reasons([e for e in mine if e.pair == pair], ckpt, pair).items()
    }


def would_keep(
    entries: Sequence[ManifestEntry],
    candidate: ManifestEntry,
    ckpt: Checkpointer,
    run: str,
    pair: Pair,
) -> bool:
    """Whether a new entry would survive retention, so is worth writing at all."""
    return candidate.file in plan([*entries, candidate], ckpt, run, pair).keep


def other_pairs(
    entries: Sequence[ManifestEntry], ckpt: Checkpointer, run: str | None, pair: Pair
) -> Counter[Pair]:
    """(metric, mode) pairs other than ``pair`` among the entries in scope, with counts."""
    return Counter(
        e.pair
        for e in entries
        if e.pair != pair and (ckpt.scope == "dir" or run is None or e.run == run)
    )


def describe_pairs(counts: Counter[Pair]) -> str:
    """'loss (min) x4, acc (max) x2'."""
    return ", ".join(f"{m} ({md}) x{n}" for (m, md), n in counts.most_common())
