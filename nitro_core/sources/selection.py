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

from nitro_core.errors import CheckpointerFix, ConfigError
from nitro_core.policy.ranked import Pair
from nitro_core.policy.selectors import Checkpointer, Selector, listed
from nitro_core.sources.grammar import Average
from nitro_core.store.manifest import ManifestEntry, Point


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
    return sel.name(points, pair)


def keep_holds(
    keep: Sequence[Selector], sel: Selector, last_epoch: int, mid_epoch: bool = False
) -> bool:
    """Whether ``keep`` still holds, after epoch ``last_epoch``, every point ``sel`` will name
    for any scores the run may see. Epochs past ``last_epoch`` are the end-of-training
    warning's business, not a refusal. With ``mid_epoch`` (``every_steps`` set) an epoch
    holds several points, so ``Last(k)`` holds the last ``k`` points, not epochs."""
    return sel.held_by(keep, last_epoch, mid_epoch)


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
            f"training (max_epochs={max_epochs}). Keep them: ",
            CheckpointerFix(f"keep=({current}, {avg.selector.keep_for()})"),
            ".",
        )


def reach_shortfall(sel: Selector, max_epochs: int, mid_epoch: bool = False) -> tuple[str, str]:
    """('', '') when a run of ``max_epochs`` epochs can pass every point ``sel`` needs;
    otherwise why it cannot and what to write instead. Without ``every_steps`` a run passes
    one point per epoch end; with it, more, so only epoch-end selectors are bounded then."""
    return sel.reach(max_epochs, mid_epoch)


def describe_epochs(epochs: Sequence[int]) -> str:
    """'2, 4, 6' (bounded) for messages."""
    return listed(epochs) or "none"


def describe_points(
    points: Sequence[Point | ManifestEntry], by_place: bool = False
) -> tuple[str, str]:
    """(noun, list) naming points or entries for messages: ``('epochs', '2, 4, 6')`` when
    all are epoch ends (and not ``by_place``: a message that names other points by their
    place names these alike), else each by its place, since several share an epoch:
    ``('points', 'epoch 3 batch 2 (step 18), epoch 3 end (step 24)')`` (bounded)."""
    if not by_place and all(p.batch is None for p in points):
        return "epochs", describe_epochs([p.epoch for p in points])
    places = [
        f"epoch {p.epoch} " + (f"batch {p.batch}" if p.batch is not None else "end")
        + f" (step {p.step})"
        for p in points
    ]  # fmt: skip
    return "points", listed(places)
