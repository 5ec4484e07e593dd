"""A selector carries its whole meaning: a fifth one, ``Odd()`` (odd epochs' ends), is one
class here, and retention, source selection, the keep-holds check and a real run take it
with no other edit."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from nitro_core import Average, Best, Checkpointer, ConfigError, Every, Last, Nitro, read_manifest
from nitro_core.policy.retention import plan
from nitro_core.policy.selectors import Selector
from nitro_core.sources.selection import check_keep_holds, select
from nitro_core.store.manifest import ManifestEntry, Point

from ..tiny import Scripted

PAIR = ("score", "min")
SCORES = (5.0, 1.0, 4.0, 2.0, 3.0, 6.0)  # odd epochs 1, 3, 5 score 5, 4, 3


@dataclass(frozen=True)
class Odd(Selector):
    """Odd epochs' end records (a test-only fifth selector; the grammar does not parse it)."""

    def __str__(self) -> str:
        return "Odd()"

    def pick(self, entries, mode):
        return [e for e in entries if e.batch is None and e.epoch % 2 == 1]

    def keeps_epoch(self, epoch, last_epoch, mid_epoch):
        return epoch % 2 == 1

    def name(self, points, pair):
        named = [p for p in points if p.batch is None and p.epoch % 2 == 1]
        return named, "" if named else "Odd() names no epoch the run reached"

    def epochs_named(self, last_epoch):
        return range(1, last_epoch + 1, 2)

    def most_points(self, max_epochs, mid_epoch):
        return (max_epochs + 1) // 2


def entries(epochs):
    return [
        ManifestEntry(
            file=f"epoch-{e:04d}.safetensors", epoch=e, step=4 * e, score=SCORES[e - 1],
            metric="score", mode="min", stop_reason=None, run="r", written="t", bytes=1,
            sha256="0" * 64,
        )
        for e in epochs
    ]  # fmt: skip


POINTS = [
    Point(epoch=i + 1, step=4 * (i + 1), score=s, metric="score", mode="min")
    for i, s in enumerate(SCORES)
]


def test_retention_keeps_what_a_fifth_selector_keeps_with_its_reason():
    got = plan(entries(range(1, 7)), Checkpointer(keep=(Odd(), Best(1))), "r", PAIR)
    assert got.keep == {
        "epoch-0001.safetensors": ("Odd()",),
        "epoch-0002.safetensors": ("Best(1): #1 by score (min)",),
        "epoch-0003.safetensors": ("Odd()",),
        "epoch-0005.safetensors": ("Odd()",),
    }
    assert got.delete == ("epoch-0004.safetensors", "epoch-0006.safetensors")


def test_an_average_of_a_fifth_selector_names_its_points_and_narrows_a_best():
    held = entries([1, 2, 3, 6])
    odd = select(Odd(), POINTS, held, PAIR)
    assert [p.epoch for p in odd.named] == [1, 3, 5] and [p.epoch for p in odd.gone] == [5]
    assert [e.epoch for e in odd.picked] == [1, 3] and odd.shortfall == ""
    best = select(Best(1, among=Odd()), POINTS, held, PAIR)
    assert [p.epoch for p in best.named] == [5] and not best.picked
    short = select(Best(4, among=Odd()), POINTS, held, PAIR).shortfall
    assert (
        short
        == "Best(4; among=Odd()) needs 4 points scored by score (min) among Odd() and the run has 3"
    )


@pytest.mark.parametrize(
    ("keep", "selector", "message"),
    [
        ((Odd(),), Odd(), None),
        ((Odd(),), Best(2, among=Odd()), None),
        ((Last(1), Every(1)), Odd(), None),
        ((Best(3), Last(1)), Odd(),
         "restore_best=Average(Odd()) needs records that keep=(Best(3), Last(1)) does not hold at "
         "the end of training (max_epochs=6). Keep them: Checkpointer(keep=(Best(3), Last(1), Odd()))."),
        ((Last(1),), Best(2, among=Odd()),
         "restore_best=Average(Best(2; among=Odd())) needs records that keep=(Last(1)) does not hold "
         "at the end of training (max_epochs=6). Keep them: Checkpointer(keep=(Last(1), Odd()))."),
        ((Odd(),), Every(3),
         "restore_best=Average(Every(3)) needs records that keep=(Odd()) does not hold at the end of "
         "training (max_epochs=6). Keep them: Checkpointer(keep=(Odd(), Every(3)))."),
        ((Odd(),), Best(4, among=Odd()),
         "restore_best=Average(Best(4; among=Odd())) can never be restored under keep=(Odd()): "
         "Best(4; among=Odd()) needs 4 scored points among Odd() and a run of max_epochs=6 passes at "
         "most 3 (one per epoch end), so the run would end keeping its final weights. Write "
         "restore_best=Average(Best(3; among=Odd()))."),
    ],
)  # fmt: skip
def test_the_keep_holds_check_takes_a_fifth_selector_on_either_side(keep, selector, message):
    avg = Average(selector)
    if message is None:
        check_keep_holds(Checkpointer(keep=keep), avg, 6)
        return
    with pytest.raises(ConfigError) as exc:
        check_keep_holds(Checkpointer(keep=keep), avg, 6)
    assert str(exc.value) == message


class KeepOdd(Scripted):
    def checkpointer(self):
        return Checkpointer(keep=(Odd(), Last(1)))


def test_a_run_keeps_and_restores_the_average_a_fifth_selector_names(tmp_path):
    n = Nitro(KeepOdd(scores=SCORES), run_dir=tmp_path, restore_best=Average(Odd()))
    n.train()
    kept = read_manifest(tmp_path)
    assert [e.epoch for e in kept] == [1, 3, 5, 6]
    assert n.averaged_from is not None and n.averaged_from["epochs"] == [1, 3, 5]
    assert n.averaged_from["state_from"] == kept[2].file  # it does not rank: the latest's state
