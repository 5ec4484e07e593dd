"""Ranking scored entries best first: what ``Best`` keeps and names, and what ``latest =>
best`` loads. Pure: entries (or points) in, entries out."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Literal, Protocol, TypeVar, cast

Mode = Literal["min", "max"]
Pair = tuple[str | None, Mode | None]  # (metric, mode): what scores are ranked under


class Scored(Protocol):
    """What :func:`ranked` ranks: a manifest entry or a run's point."""

    @property
    def score(self) -> float | None: ...


_S = TypeVar("_S", bound=Scored)


def ranked(entries: Sequence[_S], mode: Mode | None, k: int | None = None) -> list[_S]:
    """Scored entries, best first (only the best ``k`` when given, without a full sort);
    ties keep the earlier entry first. An unknown mode ranks nothing."""
    if mode is None:
        return []
    scores = [e.score for e in entries]
    try:  # the common case, every score finite: rank them all, no filtering pass
        every = math.isfinite(math.fsum(scores))  # type: ignore[arg-type]
    except TypeError:  # an entry without a score
        every = False
    kept = range(len(scores)) if every else [
        i for i, v in enumerate(scores) if v is not None and math.isfinite(v)
    ]  # fmt: skip
    keys = cast(list[float], [scores[i] for i in kept] if not every else scores)  # no None left
    if mode == "max":
        keys = [-v for v in keys]
    key: Callable[[int], float] = keys.__getitem__
    # floats compared directly (no tuple per entry), and a stable order keeps ties by index
    if k is not None:
        order: Sequence[int] = heapq.nsmallest(k, range(len(kept)), key=key)
    elif len(keys) > _SORT_IN_NUMPY:
        import numpy as np  # numpy's stable sort of a float array: a long ranking's cost

        order = np.argsort(np.asarray(keys, dtype=np.float64), kind="stable").tolist()
    else:
        order = sorted(range(len(kept)), key=key)
    if not every:
        order = list(map(kept.__getitem__, order))
    return list(map(entries.__getitem__, order))


_SORT_IN_NUMPY = 4096  # scored entries past which a full ranking sorts in numpy
