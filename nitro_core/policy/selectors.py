"""Keep selectors (``Best``, ``Last``, ``Every``, ``Epochs``), the ``Checkpointer`` that holds
them, and :func:`pick`, the pure function that says which entries a selector chooses.

Selectors choose among manifest entries given oldest first. The same selectors name what to
keep while training and what to load or average afterwards (``Best(k, among=...)`` is for
loading only). Each selector class carries its whole meaning, as orbax's preservation
policies each carry ``should_preserve``: which entries it keeps (retention), which points of a
run's history an ``Average`` of it names (source selection), which epochs it keeps whatever
the scores and whether a keep holds what it names (``restore_best``'s setup check), how many
points a run can pass for it, and how it describes itself in messages. Retention,
``sources.selection`` and the setup check only ask the selector, so a new selector is one
subclass of :class:`Selector`.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal

from nitro_core.errors import CheckpointerFix, ConfigError, NitroDeprecationWarning
from nitro_core.policy.bounds import MAX_COUNT as MAX_COUNT
from nitro_core.policy.bounds import MAX_EPOCHS as MAX_EPOCHS
from nitro_core.policy.bounds import epochs_spec, positive
from nitro_core.policy.ranked import Mode as Mode
from nitro_core.policy.ranked import Pair as Pair
from nitro_core.policy.ranked import ranked as ranked

if TYPE_CHECKING:
    from nitro_core.store.manifest import ManifestEntry, Point

NAME_PATTERN = re.compile(r"[A-Za-z0-9_.+\-]+")  # metric names and prefixes land in file names
Scope = Literal["run", "dir"]


class Selector(ABC):
    """What every selector carries. Entries and points are given oldest first; ``last_epoch``
    is the epoch a run ends at; ``mid_epoch`` says whether epochs hold mid-epoch points too
    (``Checkpointer(every_steps=N)``), so that a count of points is not a count of epochs."""

    ranks: ClassVar[bool] = False  # needs scores (an Average then takes the best's state)

    @property
    def keeps_best(self) -> int:
        """How many of the best-scored entries it keeps (0: it does not rank)."""
        return 0

    @property
    def keeps_last(self) -> int:
        """How many of the latest points it keeps, mid-epoch points included (0: none)."""
        return 0

    @abstractmethod
    def pick(self, entries: Sequence[ManifestEntry], mode: Mode | None) -> list[ManifestEntry]:
        """Retention: the entries it keeps, in their order."""

    def why(self, rank: int | None, pair: Pair) -> str:
        """Why it keeps an entry (``rank``: the entry's place by score, when it has one)."""
        return str(self)

    def check_keep(self) -> None:
        """Refuse being a training keep (``Checkpointer(keep=...)``) when it cannot be one."""
        return None  # every selector but Best(k, among=...) can be

    @abstractmethod
    def keeps_epoch(self, epoch: int, last_epoch: int, mid_epoch: bool) -> bool:
        """As part of a keep: whether it still holds ``epoch``'s end record after
        ``last_epoch``, whatever the scores."""

    @abstractmethod
    def name(self, points: Sequence[Point], pair: Pair) -> tuple[list[Point], str]:
        """Source selection: (the points of a run's history it names, '' or why the history
        is too short for it); ``pair`` is the ranking pair."""

    @abstractmethod
    def epochs_named(self, last_epoch: int) -> Sequence[int]:
        """The epochs it can name in a run of ``last_epoch`` epochs of epoch ends only."""

    def held_by(self, keep: Sequence[Selector], last_epoch: int, mid_epoch: bool) -> bool:
        """Whether ``keep`` still holds, after ``last_epoch``, every point it will name for any
        scores the run may see: by default, each epoch end it can name is kept surely."""
        return holds_epochs(keep, self.epochs_named(last_epoch), last_epoch, mid_epoch)

    @abstractmethod
    def most_points(self, max_epochs: int, mid_epoch: bool) -> int | None:
        """The most points it can name in a run of ``max_epochs`` epochs (None: no bound)."""

    def reach(self, max_epochs: int, mid_epoch: bool) -> tuple[str, str]:
        """('', '') when a run of ``max_epochs`` epochs can pass every point it needs;
        otherwise why it cannot and what to write instead."""
        return "", ""

    def keep_for(self) -> str:
        """The keep selector that holds what it names, for 'keep them: ...' advice."""
        return str(self)


@dataclass(frozen=True)
class Best(Selector):
    """The ``k`` best-scored entries under the monitor, optionally only among ``among``'s picks."""

    k: int
    among: Selector | None = None

    ranks: ClassVar[bool] = True

    def __post_init__(self) -> None:
        positive("Best", "k", self.k)
        if self.among is not None and not isinstance(self.among, Selector):
            raise ConfigError(
                f"Best({self.k}, among={self.among!r}): among must be a selector; "
                f"write Best({self.k}, among=Last(20))."
            )

    def __str__(self) -> str:
        return f"Best({self.k})" if self.among is None else f"Best({self.k}; among={self.among})"

    @property
    def keeps_best(self) -> int:
        return self.k

    def pick(self, entries: Sequence[ManifestEntry], mode: Mode | None) -> list[ManifestEntry]:
        """Finite scores only, ranked by ``mode``; ties keep the earlier entry, so a new
        record must be strictly better to displace one already kept."""
        pool = entries if self.among is None else self.among.pick(entries, mode)
        chosen = set(map(id, ranked(pool, mode, self.k)))
        return [e for e in entries if id(e) in chosen]

    def why(self, rank: int | None, pair: Pair) -> str:
        metric, mode = pair
        return f"{self}: #{rank} by {metric} ({mode})"

    def check_keep(self) -> None:
        if self.among is not None:
            raise ConfigError(
                f"Checkpointer(keep={self}): among is for loading only; while training "
                f"keep both instead: keep=(Best({self.k}), {self.among})."
            )

    def keeps_epoch(self, epoch: int, last_epoch: int, mid_epoch: bool) -> bool:
        return False  # which epochs rank best depends on the scores

    def name(self, points: Sequence[Point], pair: Pair) -> tuple[list[Point], str]:
        """Its ``k`` best ever scored under ``pair`` (``among=`` first narrows the history)."""
        among, short = (list(points), "") if self.among is None else self.among.name(points, pair)
        if short:
            return [], short
        scored = [p for p in among if p.pair == pair and p.score is not None]
        if len(scored) < self.k:
            metric, mode = pair
            return scored, (
                f"{self} needs {self.k} points scored by {metric} ({mode}){self._where} and the "
                f"run has {len(scored)}"
            )
        best = {id(p) for p in ranked(scored, mode=pair[1], k=self.k)}
        return [p for p in scored if id(p) in best], ""

    def epochs_named(self, last_epoch: int) -> Sequence[int]:
        return (
            range(1, last_epoch + 1) if self.among is None else self.among.epochs_named(last_epoch)
        )

    def held_by(self, keep: Sequence[Selector], last_epoch: int, mid_epoch: bool) -> bool:
        """Held by a ``Best`` as large, or (with ``among``) wherever its ``among`` is held; with
        epoch ends only, also by a keep that surely holds every epoch it can name."""
        if mid_epoch and self.among is not None:
            return self.among.held_by(keep, last_epoch, mid_epoch)
        if self.among is None and any(s.keeps_best >= self.k for s in keep):
            return True
        return not mid_epoch and super().held_by(keep, last_epoch, mid_epoch)

    def most_points(self, max_epochs: int, mid_epoch: bool) -> int | None:
        if self.among is not None:  # at most what its among names
            return self.among.most_points(max_epochs, mid_epoch)
        return None if mid_epoch else max_epochs

    def reach(self, max_epochs: int, mid_epoch: bool) -> tuple[str, str]:
        if self.among is not None:
            short, fix = self.among.reach(max_epochs, mid_epoch)
            if short:
                return short, fix
        return _too_few(self, f"scored points{self._where}", max_epochs, mid_epoch)

    def keep_for(self) -> str:
        return str(self) if self.among is None else str(self.among)

    @property
    def _where(self) -> str:
        return "" if self.among is None else f" among {self.among}"


@dataclass(frozen=True)
class Last(Selector):
    """The ``k`` most recently written entries."""

    k: int

    def __post_init__(self) -> None:
        positive("Last", "k", self.k)

    def __str__(self) -> str:
        return f"Last({self.k})"

    @property
    def keeps_last(self) -> int:
        return self.k

    def pick(self, entries: Sequence[ManifestEntry], mode: Mode | None) -> list[ManifestEntry]:
        """The latest entries, whatever their place in an epoch."""
        return list(entries[-self.k :])

    def keeps_epoch(self, epoch: int, last_epoch: int, mid_epoch: bool) -> bool:
        # with mid-epoch points the last k points may hold no given epoch's end
        return not mid_epoch and epoch > last_epoch - self.k

    def name(self, points: Sequence[Point], pair: Pair) -> tuple[list[Point], str]:
        """The run's last ``k`` points."""
        if len(points) < self.k:
            return list(points), f"{self} needs {self.k} points and the run passed {len(points)}"
        return list(points[-self.k :]), ""

    def epochs_named(self, last_epoch: int) -> Sequence[int]:
        return range(max(1, last_epoch - self.k + 1), last_epoch + 1)

    def held_by(self, keep: Sequence[Selector], last_epoch: int, mid_epoch: bool) -> bool:
        """With mid-epoch points, only the last ``k`` points are held: by a ``Last`` as large."""
        if mid_epoch:
            return any(s.keeps_last >= self.k for s in keep)
        return super().held_by(keep, last_epoch, mid_epoch)

    def most_points(self, max_epochs: int, mid_epoch: bool) -> int | None:
        return self.k if mid_epoch else min(self.k, max_epochs)

    def reach(self, max_epochs: int, mid_epoch: bool) -> tuple[str, str]:
        return _too_few(self, "points", max_epochs, mid_epoch)


@dataclass(frozen=True)
class Every(Selector):
    """Epoch-end entries whose epoch is a multiple of ``n`` (mid-epoch records never)."""

    n: int

    def __post_init__(self) -> None:
        positive("Every", "n", self.n, MAX_EPOCHS)

    def __str__(self) -> str:
        return f"Every({self.n})"

    def pick(self, entries: Sequence[ManifestEntry], mode: Mode | None) -> list[ManifestEntry]:
        return [e for e in entries if e.batch is None and e.epoch % self.n == 0]

    def keeps_epoch(self, epoch: int, last_epoch: int, mid_epoch: bool) -> bool:
        return epoch % self.n == 0

    def name(self, points: Sequence[Point], pair: Pair) -> tuple[list[Point], str]:
        named = [p for p in points if p.batch is None and p.epoch % self.n == 0]
        last = points[-1].epoch if points else 0
        short = "" if named else f"{self} names no epoch the run reached (it ended at epoch {last})"
        return named, short

    def epochs_named(self, last_epoch: int) -> Sequence[int]:
        return range(self.n, last_epoch + 1, self.n)

    def most_points(self, max_epochs: int, mid_epoch: bool) -> int | None:
        return max_epochs // self.n

    def reach(self, max_epochs: int, mid_epoch: bool) -> tuple[str, str]:
        if self.n <= max_epochs:
            return "", ""
        return (
            f"{self} names every {self.n}th epoch end and a run of max_epochs={max_epochs} "
            "reaches none",
            f"Write restore_best=Average(Every({max_epochs})) or train for {self.n} epochs "
            f"(max_epochs={self.n})",
        )


@dataclass(frozen=True, init=False)
class Epochs(Selector):
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
        epochs, text = epochs_spec(spec)
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

    def pick(self, entries: Sequence[ManifestEntry], mode: Mode | None) -> list[ManifestEntry]:
        return [e for e in entries if e.batch is None and e.epoch in self]

    def keeps_epoch(self, epoch: int, last_epoch: int, mid_epoch: bool) -> bool:
        return epoch in self

    def name(self, points: Sequence[Point], pair: Pair) -> tuple[list[Point], str]:
        last = points[-1].epoch if points else 0
        named = [p for p in points if p.batch is None and p.epoch in self]  # a range: arithmetic
        beyond = self.epochs[bisect.bisect_right(self.epochs, last) :]
        short = (
            f"{self} names epochs the run never reached ({listed(beyond)}; it ended at epoch "
            f"{last})"
            if beyond
            else ""
        )
        return named, short

    def epochs_named(self, last_epoch: int) -> Sequence[int]:
        return self.epochs[: bisect.bisect_right(self.epochs, last_epoch)]

    def most_points(self, max_epochs: int, mid_epoch: bool) -> int | None:
        return len(self.epochs_named(max_epochs))

    def reach(self, max_epochs: int, mid_epoch: bool) -> tuple[str, str]:
        beyond = self.epochs[bisect.bisect_right(self.epochs, max_epochs) :]
        if not beyond:
            return "", ""
        last = beyond[-1]
        return (
            f"{self} names epochs past max_epochs={max_epochs} ({listed(beyond)})",
            f"Name epochs up to {max_epochs} in Epochs(...), or train for {last} epochs "
            f"(max_epochs={last})",
        )


def holds_epochs(
    keep: Sequence[Selector], epochs: Sequence[int], last_epoch: int, mid_epoch: bool
) -> bool:
    """Whether ``keep`` keeps each of ``epochs``' end records whatever the scores."""
    return all(any(s.keeps_epoch(e, last_epoch, mid_epoch) for s in keep) for e in epochs)


def _too_few(sel: Best | Last, what: str, max_epochs: int, mid_epoch: bool) -> tuple[str, str]:
    """``reach`` of a selector counting ``k`` points when a run passes fewer."""
    most = sel.most_points(max_epochs, mid_epoch)
    if most is None or sel.k <= most:
        return "", ""
    longer = f" or train for {sel.k} epochs (max_epochs={sel.k})" if most == max_epochs else ""
    fewer = f"Write restore_best=Average({dataclasses.replace(sel, k=most)}){longer}"
    return (
        f"{sel} needs {sel.k} {what} and a run of max_epochs={max_epochs} passes at most "
        f"{most} (one per epoch end)",
        fewer if most > 0 else f"Train for {sel.k} epochs",
    )


def listed(items: Sequence[object], limit: int = 8) -> str:
    """'6, 7' or '1, 2, ... 8 and 3 more': a bounded list for messages."""
    shown = ", ".join(map(str, items[:limit]))
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def pick(
    selector: Selector, entries: Sequence[ManifestEntry], mode: Mode | None
) -> list[ManifestEntry]:
    """The entries ``selector`` chooses from ``entries`` (oldest first), in their order: see
    each selector's ``pick``."""
    return selector.pick(entries, mode)


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
                "Checkpointer(keep=()) keeps nothing; write ",
                CheckpointerFix("keep=Last(1)"),
                ", or return None from checkpointer() to write no checkpoints.",
            )
        for sel in self.keep:
            if not isinstance(sel, Selector):
                raise ConfigError(
                    f"Checkpointer(keep=...) got {sel!r}, which is not a selector; write "
                    "Best(k), Last(k), Every(n) or Epochs(...), e.g. keep=(Best(3), Last(1))."
                )
            sel.check_keep()
        if (self.metric is None) != (self.mode is None):
            given = f"metric={self.metric!r}" if self.mode is None else f"mode={self.mode!r}"
            raise ConfigError(
                f"Checkpointer({given}) gives one of metric and mode; give both, e.g. ",
                CheckpointerFix("metric='acc', mode='max'"),
                ", or neither to rank by the monitor.",
            )
        if self.mode not in (None, "min", "max"):
            raise ConfigError(f"Checkpointer(mode={self.mode!r}): mode is 'min' or 'max'.")
        if self.name is not None and not NAME_PATTERN.fullmatch(self.name):
            raise ConfigError(
                f"Checkpointer(name={self.name!r}): a file-name prefix takes letters, digits and "
                "'_', '.', '+', '-' only (no path separators); write e.g. ",
                CheckpointerFix("name='model'"),
                ".",
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
                "e.g. ",
                CheckpointerFix("every_steps=500"),
                ".",
            )
        if not isinstance(self.async_write, bool):
            raise ConfigError(
                f"Checkpointer(async_write={self.async_write!r}): write True (records written on "
                "a background thread, the default) or False (written before training goes on)."
            )

    @property
    def ranks(self) -> bool:
        """Whether some selector needs scores."""
        return any(s.ranks for s in self.keep)

    @property
    def best_only(self) -> bool:
        """Whether every selector needs scores (an unscored epoch is never kept)."""
        return all(s.ranks for s in self.keep)

    @property
    def k(self) -> int:
        """The largest ``Best`` k (``TopKCheckpointer``'s ``k``)."""
        return max((s.keeps_best for s in self.keep), default=0)

    @property
    def keep_latest(self) -> int:
        """The largest ``Last`` k (``TopKCheckpointer``'s ``keep_latest``)."""
        return max((s.keeps_last for s in self.keep), default=0)

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
