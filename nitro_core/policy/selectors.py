"""Keep selectors (``Best``, ``Last``, ``Every``, ``Epochs``), the ``Checkpointer`` that holds
them, and :func:`pick`, the pure function that says which entries a selector chooses.

Selectors choose among manifest entries given oldest first. The same selectors name what to
keep while training and what to load or average afterwards (``Best(k, among=...)`` is for
loading only).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, TypeGuard, TypeVar, Union, cast

from nitro_core.errors import ConfigError, NitroDeprecationWarning

if TYPE_CHECKING:
    from nitro_core.store.manifest import ManifestEntry

Mode = Literal["min", "max"]
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.+\-]+")  # metric names and prefixes land in file names
Scope = Literal["run", "dir"]


MAX_EPOCHS = 1_000_000  # the largest epoch number a selector names (what a run can hold)
MAX_COUNT = 100_000  # the most records a selector counts (Best k, Last k, an Epochs set)


def _positive(kind: str, name: str, value: object, limit: int = MAX_COUNT) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{kind}({value!r}): {name} must be a positive integer; write {kind}(3).")
    if value > limit:
        raise ConfigError(
            f"{kind}({value}): {name} is at most {limit} ({_LIMIT_REASON[limit]}); write {kind}(3)."
        )


_LIMIT_REASON = {
    MAX_COUNT: "the most records a selector picks",
    MAX_EPOCHS: "a run holds at most that many epochs",
}


@dataclass(frozen=True)
class Best:
    """The ``k`` best-scored entries under the monitor, optionally only among ``among``'s picks."""

    k: int
    among: Selector | None = None

    def __post_init__(self) -> None:
        _positive("Best", "k", self.k)
        if self.among is not None and not isinstance(self.among, SELECTOR_TYPES):
            raise ConfigError(
                f"Best({self.k}, among={self.among!r}): among must be a selector; "
                f"write Best({self.k}, among=Last(20))."
            )

    def __str__(self) -> str:
        return f"Best({self.k})" if self.among is None else f"Best({self.k}; among={self.among})"


@dataclass(frozen=True)
class Last:
    """The ``k`` most recently written entries."""

    k: int

    def __post_init__(self) -> None:
        _positive("Last", "k", self.k)

    def __str__(self) -> str:
        return f"Last({self.k})"


@dataclass(frozen=True)
class Every:
    """Epoch-end entries whose epoch is a multiple of ``n`` (mid-epoch records never)."""

    n: int

    def __post_init__(self) -> None:
        _positive("Every", "n", self.n, MAX_EPOCHS)

    def __str__(self) -> str:
        return f"Every({self.n})"


@dataclass(frozen=True, init=False)
class Epochs:
    """Specific epochs' end records: ``Epochs(5)``, ``Epochs(range(3, 8))`` or
    ``Epochs([2, 4, 6])`` (mid-epoch records never).

    ``epochs`` holds them sorted, as a ``range`` when they are consecutive (stored by its
    ends, never expanded) and a tuple otherwise; ``epoch in selector`` tests membership
    without building a set. At most ``MAX_COUNT`` epochs, each from 1 to ``MAX_EPOCHS``.
    """

    epochs: range | tuple[int, ...]
    text: str = field(compare=False)
    _lookup: range | frozenset[int] = field(compare=False, repr=False)

    def __init__(self, spec: int | range | Iterable[int]) -> None:
        epochs, text = _epochs(spec)
        if epochs[-1] - epochs[0] + 1 == len(epochs):
            epochs = range(epochs[0], epochs[-1] + 1)  # consecutive: equal to the same range
        object.__setattr__(self, "epochs", epochs)
        object.__setattr__(self, "text", text)
        lookup = epochs if isinstance(epochs, range) else frozenset(epochs)
        object.__setattr__(self, "_lookup", lookup)

    def __contains__(self, epoch: object) -> bool:
        return epoch in self._lookup

    def __str__(self) -> str:
        return f"Epochs({self.text})"


def _epochs(spec: object) -> tuple[range | tuple[int, ...], str]:
    """The sorted epochs ``spec`` names and their text, refusing what no run can hold."""
    hint = "write Epochs(5), Epochs(range(3, 8)) or Epochs([2, 4, 6])."
    if isinstance(spec, range) and spec.step == 1 and len(spec) > 0:
        epochs: range | tuple[int, ...] = spec
        text = f"{spec.start}:{spec.stop - 1}"
    elif isinstance(spec, int) and not isinstance(spec, bool):
        epochs, text = range(spec, spec + 1), str(spec)
    else:
        values = tuple(itertools.islice(spec, MAX_COUNT + 1)) if _iterable(spec) else (spec,)
        if len(values) > MAX_COUNT:
            raise ConfigError(
                f"Epochs(...) names more than {MAX_COUNT} epochs; a selector picks at most "
                f"{MAX_COUNT} records. Write a range, e.g. Epochs(range(1, {MAX_COUNT + 1}))."
            )
        numbers = [e for e in values if isinstance(e, int) and not isinstance(e, bool)]
        if not values or len(numbers) != len(values):
            raise ConfigError(f"Epochs({_short(repr(spec))}): give positive epoch numbers; {hint}")
        epochs = tuple(sorted(set(numbers)))
        text = "[" + ", ".join(map(str, values)) + "]"
    if not epochs or epochs[0] < 1:
        raise ConfigError(f"Epochs({_short(repr(spec))}): give positive epoch numbers; {hint}")
    if epochs[-1] > MAX_EPOCHS:
        raise ConfigError(
            f"Epochs({_short(text)}) names epoch {epochs[-1]}; a run holds at most {MAX_EPOCHS} "
            f"epochs. Name epochs from 1 to {MAX_EPOCHS}; {hint}"
        )
    if len(epochs) > MAX_COUNT:
        raise ConfigError(
            f"Epochs({_short(text)}) names {len(epochs)} epochs; a selector picks at most {MAX_COUNT} "
            f"records. Name fewer, e.g. Epochs({epochs[0]}:{epochs[0] + MAX_COUNT - 1})."
        )
    return epochs, text


def _iterable(value: object) -> TypeGuard[Iterable[object]]:
    return isinstance(value, Iterable) and not isinstance(value, str | bytes)


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


Selector = Union[Best, Last, Every, Epochs]  # noqa: UP007 - used at runtime by isinstance
SELECTOR_TYPES = (Best, Last, Every, Epochs)


def pick(
    selector: Selector, entries: Sequence[ManifestEntry], mode: Mode | None
) -> list[ManifestEntry]:
    """The entries ``selector`` chooses from ``entries`` (oldest first), in their order.

    ``Last`` takes the latest entries whatever their place in an epoch; ``Every`` and
    ``Epochs`` take epoch-end entries only (``batch`` None). ``Best`` ranks finite scores
    only, by ``mode``; ties keep the earlier entry, so a new record must be strictly better
    to displace one already kept.
    """
    if isinstance(selector, Last):
        return list(entries[-selector.k :])
    if isinstance(selector, Every):
        return [e for e in entries if e.batch is None and e.epoch % selector.n == 0]
    if isinstance(selector, Epochs):
        return [e for e in entries if e.batch is None and e.epoch in selector]
    pool = entries if selector.among is None else pick(selector.among, entries, mode)
    chosen = set(map(id, ranked(pool, mode, selector.k)))
    return [e for e in entries if id(e) in chosen]


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


@dataclass(frozen=True, init=False)
class Checkpointer:
    """Which records a run writes and keeps: the union of the ``keep`` selectors.

    ``keep`` takes one selector or several and is stored as a tuple. ``metric`` and
    ``mode`` rank by something other than the experiment's monitor (give both).
    ``scope="run"`` confines retention to the run's own entries; ``scope="dir"`` ranks and
    deletes across every run in the directory. ``dir`` stores records somewhere other than
    the run directory; ``name`` prefixes every record's file name.

    ``every_steps=N`` adds a checkpoint point after every N optimizer steps to the one at
    each epoch end: it validates, checks the monitor, decides stops, logs and offers a
    record, as an epoch end does. ``async_write=True`` (the default) blocks training only
    while the state is copied to host memory and writes the record on a background thread
    (one write in flight; ``train()`` returns after the last is committed, and raises a
    failed write's error at the next point or at its end); ``False`` writes in the step.
    """

    keep: tuple[Selector, ...]
    metric: str | None
    mode: Mode | None
    scope: Scope
    dir: str | None
    name: str | None
    every_steps: int | None
    async_write: bool

    def __init__(
        self,
        keep: Selector | tuple[Selector, ...] | list[Selector] = (Best(3), Last(1)),
        metric: str | None = None,
        mode: Mode | None = None,
        scope: Scope = "run",
        dir: str | None = None,
        name: str | None = None,
        every_steps: int | None = None,
        async_write: bool = True,
    ) -> None:
        # A hand-written __init__ so that ``keep`` accepts one selector yet reads as a tuple.
        selectors = keep if isinstance(keep, tuple | list) else (keep,)
        object.__setattr__(self, "keep", tuple(selectors))
        object.__setattr__(self, "metric", metric)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "scope", scope)
        object.__setattr__(self, "dir", dir)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "every_steps", every_steps)
        object.__setattr__(self, "async_write", async_write)
        self._validate()

    def _validate(self) -> None:
        if not self.keep:
            raise ConfigError(
                "Checkpointer(keep=()) keeps nothing; write Checkpointer(keep=Last(1)), or "
                "return None from checkpointer() to write no checkpoints."
            )
        for sel in self.keep:
            if not isinstance(sel, SELECTOR_TYPES):
                raise ConfigError(
                    f"Checkpointer(keep=...) got {sel!r}, which is not a selector; write "
                    "Best(k), Last(k), Every(n) or Epochs(...), e.g. keep=(Best(3), Last(1))."
                )
            if isinstance(sel, Best) and sel.among is not None:
                raise ConfigError(
                    f"Checkpointer(keep={sel}): among is for loading only; while training "
                    f"keep both instead: keep=(Best({sel.k}), {sel.among})."
                )
        if (self.metric is None) != (self.mode is None):
            given = f"metric={self.metric!r}" if self.mode is None else f"mode={self.mode!r}"
            raise ConfigError(
                f"Checkpointer({given}) gives one of metric and mode; give both, e.g. "
                "Checkpointer(metric='acc', mode='max'), or neither to rank by the monitor."
            )
        if self.mode not in (None, "min", "max"):
            raise ConfigError(f"Checkpointer(mode={self.mode!r}): mode is 'min' or 'max'.")
        if self.name is not None and not NAME_PATTERN.fullmatch(self.name):
            raise ConfigError(
                f"Checkpointer(name={self.name!r}): a file-name prefix takes letters, digits and "
                "'_', '.', '+', '-' only (no path separators); write e.g. Checkpointer(name='model')."
            )
        if self.scope not in ("run", "dir"):
            raise ConfigError(f"Checkpointer(scope={self.scope!r}): scope is 'run' or 'dir'.")
        steps = self.every_steps
        if steps is not None and (
            isinstance(steps, bool) or not isinstance(steps, int) or steps < 1
        ):
            raise ConfigError(
                f"Checkpointer(every_steps={steps!r}): every_steps is a positive number of "
                "optimizer steps between checkpoint points, or None for epoch ends only; write "
                "e.g. Checkpointer(every_steps=500)."
            )
        if not isinstance(self.async_write, bool):
            raise ConfigError(
                f"Checkpointer(async_write={self.async_write!r}): write True (records written on "
                "a background thread, the default) or False (written before training goes on)."
            )

    @property
    def ranks(self) -> bool:
        """Whether some selector needs scores."""
        return any(isinstance(s, Best) for s in self.keep)

    @property
    def best_only(self) -> bool:
        return all(isinstance(s, Best) for s in self.keep)

    @property
    def k(self) -> int:
        """The largest ``Best`` k (``TopKCheckpointer``'s ``k``)."""
        return max((s.k for s in self.keep if isinstance(s, Best)), default=0)

    @property
    def keep_latest(self) -> int:
        """The largest ``Last`` k (``TopKCheckpointer``'s ``keep_latest``)."""
        return max((s.k for s in self.keep if isinstance(s, Last)), default=0)

    def __str__(self) -> str:
        return "(" + ", ".join(map(str, self.keep)) + ")"


def TopKCheckpointer(  # noqa: N802 - the deprecated name is the public contract
    k: int = 3,
    metric: str | None = None,
    mode: Mode | None = None,
    dir: str | None = None,
    name: str | None = None,
    scope: Scope = "run",
    keep_latest: bool | int = True,
) -> Checkpointer:
    """Deprecated: build the equivalent ``Checkpointer(keep=(Best(k), Last(keep_latest)))``."""
    _warn_topk_once()
    latest = int(keep_latest)
    keep: tuple[Selector, ...] = (Best(k), Last(latest)) if latest else (Best(k),)
    return Checkpointer(keep=keep, metric=metric, mode=mode, scope=scope, dir=dir, name=name)


@functools.cache
def _warn_topk_once() -> None:
    # functools.cache makes this once per session (per interpreter), as the spec asks.
    warnings.warn(
        "TopKCheckpointer is deprecated and supported until at least 1.0.0; write "
        "Checkpointer(keep=(Best(k), Last(1)), metric=..., mode=...) instead (same files).",
        NitroDeprecationWarning,
        stacklevel=3,
    )
