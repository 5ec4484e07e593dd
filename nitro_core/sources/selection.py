"""What a selector names in one run's history, and whether a keep can hold it: pure
decisions over manifest points and entries.

A run passes a *point* at every epoch end, and with ``Checkpointer(every_steps=N)`` after
every N optimizer steps inside an epoch, written or not; the manifest records them all.
An ``Average``'s selector names points of that history, not of what survived retention:
``Last(k)`` is the run's last ``k`` points, ``Best(k)`` its best ``k`` ever scored under the
ranking pair (``among=`` first narrows the history), ``Every(n)`` and ``Epochs(...)`` the
epoch ends (never a mid-epoch point) whose epoch they name. The run must still hold every point named;
:func:`select` says which entries those are, which are gone, or why the run has too few.
:func:`keep_holds` answers the setup question for ``restore_best=Average(...)``: will a
keep still hold, at the end of training, everything the selector will name?
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nitro_core.errors import ConfigError
from nitro_core.policy.selectors import (
    Best,
    Checkpointer,
    Epochs,
    Every,
    Last,
    Mode,
    Selector,
    ranked,
)
from nitro_core.sources.grammar import Average
from nitro_core.store.manifest import ManifestEntry, Point

Pair = tuple[str | None, Mode | None]


@dataclass(frozen=True)
class Selection:
    """The points a selector names, the entries holding them, and what is missing."""

    named: tuple[Point, ...]
    picked: tuple[ManifestEntry, ...]  # the entries of the named points, oldest first
    gone: tuple[Point, ...]  # named points whose record the run no longer holds
    shortfall: str  # '' or why the run's history is too short for the selector


def history(points: Sequence[Point], entries: Sequence[ManifestEntry]) -> list[Point]:
    """A run's points, oldest first; for a run recorded before points were kept, its
    entries stand in for them."""
    if points:
        return list(points)
    return [
        Point(
            epoch=e.epoch, batch=e.batch, step=e.step, score=e.score, metric=e.metric, mode=e.mode
        )
        for e in entries
    ]


def select(
    sel: Selector, points: Sequence[Point], entries: Sequence[ManifestEntry], pair: Pair
) -> Selection:
    """What ``sel`` names in a run's ``points`` and which of ``entries`` (the run's own)
    hold it."""
    named, shortfall = name_points(sel, points, pair)
    held = {(e.epoch, e.step): e for e in entries}
    picked = tuple(held[(p.epoch, p.step)] for p in named if (p.epoch, p.step) in held)
    gone = tuple(p for p in named if (p.epoch, p.step) not in held)
    return Selection(tuple(named), picked, gone, shortfall)


def name_points(sel: Selector, points: Sequence[Point], pair: Pair) -> tuple[list[Point], str]:
    """(the points ``sel`` names, '' or why the history is too short for it)."""
    last = points[-1].epoch if points else 0
    if isinstance(sel, Last):
        if len(points) < sel.k:
            return list(points), f"{sel} needs {sel.k} points and the run passed {len(points)}"
        return list(points[-sel.k :]), ""
    if isinstance(sel, Every):
        named = [p for p in points if p.batch is None and p.epoch % sel.n == 0]
        short = "" if named else f"{sel} names no epoch the run reached (it ended at epoch {last})"
        return named, short
    if isinstance(sel, Epochs):
        beyond = [e for e in sel.epochs if e > last]
        named = [p for p in points if p.batch is None and p.epoch in sel]  # a range: arithmetic
        short = (
            f"{sel} names epochs the run never reached ({_epochs(beyond)}; it ended at epoch "
            f"{last})"
            if beyond
            else ""
        )
        return named, short
    among, short = (list(points), "") if sel.among is None else name_points(sel.among, points, pair)
    if short:
        return [], short
    scored = [p for p in among if p.pair == pair and p.score is not None]
    if len(scored) < sel.k:
        metric, mode = pair
        where = "" if sel.among is None else f" among {sel.among}"
        return scored, (
            f"{sel} needs {sel.k} points scored by {metric} ({mode}){where} and the run has "
            f"{len(scored)}"
        )
    best = {id(p) for p in ranked(scored, mode=pair[1], k=sel.k)}
    return [p for p in scored if id(p) in best], ""


def keep_holds(
    keep: Sequence[Selector], sel: Selector, last_epoch: int, mid_epoch: bool = False
) -> bool:
    """Whether ``keep`` still holds, after epoch ``last_epoch``, every point ``sel`` will name
    for any scores the run may see. Epochs past ``last_epoch`` are the end-of-training
    warning's business, not a refusal. With ``mid_epoch`` (``every_steps`` set) an epoch
    holds several points, so ``Last(k)`` holds the last ``k`` points, not epochs."""
    if mid_epoch:
        return _holds_points(keep, sel, last_epoch)
    everything = range(1, last_epoch + 1)
    if isinstance(sel, Best):
        if sel.among is not None:
            return _holds_epochs(keep, _epochs_named(sel.among, last_epoch), last_epoch)
        if any(isinstance(s, Best) and s.k >= sel.k for s in keep):
            return True
        return _holds_epochs(keep, everything, last_epoch)
    return _holds_epochs(keep, _epochs_named(sel, last_epoch), last_epoch)


def _epochs_named(sel: Selector, last_epoch: int) -> list[int]:
    """The epochs a Last/Every/Epochs (or Best's ``among``) can name in a run of
    ``last_epoch`` epochs; a Best can name any of them."""
    if isinstance(sel, Last):
        return list(range(max(1, last_epoch - sel.k + 1), last_epoch + 1))
    if isinstance(sel, Every):
        return list(range(sel.n, last_epoch + 1, sel.n))
    if isinstance(sel, Epochs):
        return [e for e in sel.epochs if e <= last_epoch]
    return _epochs_named(sel.among, last_epoch) if sel.among else list(range(1, last_epoch + 1))


def _holds_epochs(keep: Sequence[Selector], epochs: Sequence[int], last_epoch: int) -> bool:
    """Whether ``keep`` keeps each of ``epochs`` whatever the scores (Best guarantees none)."""

    def kept(e: int) -> bool:
        return any(
            (isinstance(s, Last) and e > last_epoch - s.k)
            or (isinstance(s, Every) and e % s.n == 0)
            or (isinstance(s, Epochs) and e in s.epochs)
            for s in keep
        )

    return all(kept(e) for e in epochs)


def _holds_points(keep: Sequence[Selector], sel: Selector, last_epoch: int) -> bool:
    """``keep_holds`` when epochs hold mid-epoch points: ``Last(k)`` holds the last ``k``
    points (a ``Last`` of at most ``k``), never given epochs; the epoch ends an ``Every`` or
    ``Epochs`` names are held by the keep's ``Every``/``Epochs``; a ``Best`` by a ``Best`` as
    large, or (with ``among``) wherever its ``among`` is held."""
    if isinstance(sel, Last):
        return any(isinstance(s, Last) and s.k >= sel.k for s in keep)
    if isinstance(sel, Every | Epochs):
        by_epoch = [s for s in keep if not isinstance(s, Last)]
        return _holds_epochs(by_epoch, _epochs_named(sel, last_epoch), last_epoch)
    if sel.among is not None:
        return _holds_points(keep, sel.among, last_epoch)
    return any(isinstance(s, Best) and s.k >= sel.k for s in keep)


def keep_for(sel: Selector) -> str:
    if isinstance(sel, Best):
        return str(sel.among) if sel.among is not None else f"Best({sel.k})"
    return str(sel)


def check_keep_holds(ckpt: Checkpointer | None, avg: Average, max_epochs: int) -> None:
    """Setup refusal for ``restore_best=Average(...)``: refuse only a keep that cannot hold,
    at the end of a ``max_epochs`` run, everything the selector will name."""
    keep = ckpt.keep if ckpt is not None else ()
    mid_epoch = ckpt is not None and ckpt.every_steps is not None
    current = ", ".join(map(str, keep))
    short, fix = reach_shortfall(avg.selector, max_epochs, mid_epoch)
    if short:
        raise ConfigError(
            f"restore_best={avg} can never be restored under keep=({current}): {short}, so "
            f"the run would end keeping its final weights. {fix}."
        )
    if not keep_holds(keep, avg.selector, max_epochs, mid_epoch):
        raise ConfigError(
            f"restore_best={avg} needs records that keep=({current}) does not hold at the end of "
            f"training (max_epochs={max_epochs}). Keep them: "
            f"Checkpointer(keep=({current}, {keep_for(avg.selector)}))."
        )


def reach_shortfall(sel: Selector, max_epochs: int, mid_epoch: bool = False) -> tuple[str, str]:
    """('', '') when a run of ``max_epochs`` epochs can pass every point ``sel`` needs;
    otherwise why it cannot and what to write instead. Without ``every_steps`` a run passes
    one point per epoch end; with it, more, so only epoch-end selectors are bounded then."""
    if isinstance(sel, Every) and sel.n > max_epochs:
        return (
            f"{sel} names every {sel.n}th epoch end and a run of max_epochs={max_epochs} reaches "
            "none",
            f"Write restore_best=Average(Every({max_epochs})) or train for {sel.n} epochs (max_epochs={sel.n})",
        )
    if isinstance(sel, Epochs):
        beyond = [e for e in sel.epochs if e > max_epochs]
        if beyond:
            last = beyond[-1]
            return (
                f"{sel} names epochs past max_epochs={max_epochs} ({_epochs(beyond)})",
                f"Name epochs up to {max_epochs} in Epochs(...), or train for {last} epochs (max_epochs={last})",
            )
        return "", ""
    if isinstance(sel, Best) and sel.among is not None:
        short, fix = reach_shortfall(sel.among, max_epochs, mid_epoch)
        if short:
            return short, fix
    most = _most_points(sel, max_epochs, mid_epoch)
    if isinstance(sel, Last | Best) and most is not None and sel.k > most:
        what = "points" if isinstance(sel, Last) else "scored points"
        among = "" if not isinstance(sel, Best) or sel.among is None else f" among {sel.among}"
        fewer = f"Average({type(sel).__name__}({most}{_among(sel)}))"
        longer = f" or train for {sel.k} epochs (max_epochs={sel.k})" if most == max_epochs else ""
        return (
            f"{sel} needs {sel.k} {what}{among} and a run of max_epochs={max_epochs} passes at "
            f"most {most} (one per epoch end)",
            f"Write restore_best={fewer}{longer}" if most > 0 else f"Train for {sel.k} epochs",
        )
    return "", ""


def _most_points(sel: Selector, max_epochs: int, mid_epoch: bool) -> int | None:
    """The most points ``sel`` can name in a run of ``max_epochs`` epochs (None: no bound)."""
    if isinstance(sel, Last):
        return sel.k if mid_epoch else min(sel.k, max_epochs)
    if isinstance(sel, Every):
        return max_epochs // sel.n
    if isinstance(sel, Epochs):
        return len([e for e in sel.epochs if e <= max_epochs])
    if sel.among is not None:  # a Best: at most what its among names
        return _most_points(sel.among, max_epochs, mid_epoch)
    return None if mid_epoch else max_epochs


def _among(sel: Selector) -> str:
    return f"; among={sel.among}" if isinstance(sel, Best) and sel.among is not None else ""


def _epochs(epochs: Sequence[object], limit: int = 8) -> str:
    shown = ", ".join(map(str, epochs[:limit]))
    return shown + (f" and {len(epochs) - limit} more" if len(epochs) > limit else "")


def describe_epochs(epochs: Sequence[int]) -> str:
    """'2, 4, 6' (bounded) for messages."""
    return _epochs(list(epochs)) or "none"


def describe_points(points: Sequence[Point | ManifestEntry]) -> tuple[str, str]:
    """(noun, list) naming points or entries for messages: ``('epochs', '2, 4, 6')`` when
    all are epoch ends, else each by its place, since several share an epoch: ``('points',
    'epoch 3 batch 2 (step 18), epoch 3 end (step 24)')`` (bounded)."""
    if all(p.batch is None for p in points):
        return "epochs", describe_epochs([p.epoch for p in points])
    places = [
        f"epoch {p.epoch} " + (f"batch {p.batch}" if p.batch is not None else "end")
        + f" (step {p.step})"
        for p in points
    ]  # fmt: skip
    return "points", _epochs(places)
