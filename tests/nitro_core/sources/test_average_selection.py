"""An Average names points of the run's history, not what survived retention: the run must
still hold every point named, or the refusal lists what it kept and the keep that would
have held them. The same selection serves weights=, average_checkpoints, restore_best."""

from __future__ import annotations

import warnings

import pytest
import torch

from nitro_core import (
    Average,
    Best,
    CheckpointNotFound,
    ConfigError,
    Epochs,
    Every,
    Last,
    Nitro,
    NitroWarning,
    average_checkpoints,
    read_manifest,
)
from nitro_core.sources.selection import history, keep_holds, name_points, select
from nitro_core.store.manifest import ManifestEntry, Point, read_points

from ..tiny import Scripted

PAIR = ("score", "min")
SCORES = (5.0, 1.0, 4.0, 2.0, 3.0, 6.0)  # epoch 2 best, then 4, 5, 3, 1, 6


def points(scores=SCORES):
    return [
        Point(epoch=i + 1, step=4 * (i + 1), score=s, metric="score", mode="min")
        for i, s in enumerate(scores)
    ]


def entries_for(epochs):
    return [
        ManifestEntry(
            file=f"epoch-{e:04d}.safetensors", epoch=e, step=4 * e, score=SCORES[e - 1],
            metric="score", mode="min", stop_reason=None, run="r", written="t", bytes=1,
            sha256="0" * 64,
        )
        for e in epochs
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("selector", "named", "shortfall"),
    [
        (Last(3), [4, 5, 6], ""),
        (Last(6), [1, 2, 3, 4, 5, 6], ""),
        (Last(7), [1, 2, 3, 4, 5, 6], "Last(7) needs 7 points and the run passed 6"),
        (Best(2), [2, 4], ""),
        (Best(1), [2], ""),
        (Best(2, among=Last(3)), [4, 5], ""),
        (Best(3, among=Last(2)), [5, 6], "Best(3; among=Last(2)) needs 3 points scored by score (min) among Last(2) and the run has 2"),
        (Best(7), [1, 2, 3, 4, 5, 6], "Best(7) needs 7 points scored by score (min) and the run has 6"),
        (Every(2), [2, 4, 6], ""),
        (Every(7), [], "Every(7) names no epoch the run reached (it ended at epoch 6)"),
        (Epochs(range(3, 4)), [3], ""),
        (Epochs([2, 9]), [2], "Epochs([2, 9]) names epochs the run never reached (9; it ended at epoch 6)"),
    ],
)  # fmt: skip
def test_a_selector_names_points_of_the_runs_history(selector, named, shortfall):
    got, short = name_points(selector, points(), PAIR)
    assert [p.epoch for p in got] == named
    assert short == shortfall


@pytest.mark.parametrize(
    ("selector", "held", "picked", "gone"),
    [
        (Last(3), [2, 4, 6], [4, 6], [5]),  # (Best(2), Last(1)) over 6 epochs holds 2, 4, 6
        (Best(2), [4, 5, 6], [4], [2]),  # Last(3) holds 4, 5, 6; the second best, 2, is gone
        (Last(3), [4, 5, 6], [4, 5, 6], []),
        (Best(2), [2, 4, 6], [2, 4], []),
    ],
)
def test_selection_reports_the_named_points_the_run_no_longer_holds(selector, held, picked, gone):
    chosen = select(selector, points(), entries_for(held), PAIR)
    assert [e.epoch for e in chosen.picked] == picked
    assert [p.epoch for p in chosen.gone] == gone


def test_a_run_without_recorded_points_falls_back_to_its_entries():
    held = entries_for([2, 4, 6])
    chosen = select(Last(2), history([], held), held, PAIR)
    assert [e.epoch for e in chosen.picked] == [4, 6] and not chosen.gone


def train(tmp_path, keep, scores=SCORES, **kw):
    exp = Scripted(keep=keep, scores=scores, max_epochs=len(scores))
    return Nitro(exp, run_dir=tmp_path, **kw).train()


def test_every_point_is_recorded_even_when_no_record_is_written(tmp_path):
    n = train(tmp_path, "(Best(2))")
    assert [e.epoch for e in read_manifest(tmp_path)] == [2, 4]
    recorded = read_points(tmp_path)[n.run_id]
    assert [(p.epoch, p.score) for p in recorded] == [(i + 1, s) for i, s in enumerate(SCORES)]


def test_averaging_last_k_refuses_when_the_last_k_epochs_are_not_all_held(tmp_path):
    n = train(tmp_path, "(Best(2), Last(1))")
    assert [e.epoch for e in read_manifest(tmp_path)] == [2, 4, 6]
    with pytest.raises(CheckpointNotFound) as exc:
        average_checkpoints(tmp_path, "latest => Average(Last(3))")
    assert str(exc.value) == (
        f"Cannot average 'latest => Average(Last(3))' in {str(tmp_path)!r}: Last(3) names epochs "
        f"4, 5, 6 of run {n.run_id}, which kept epochs 2, 4, 6 under keep=(Best(2), Last(1)); "
        "it no longer holds 5. Keep them while training: Checkpointer(keep=(Best(2), Last(1), Last(3)))."
    )


def test_averaging_best_k_refuses_when_a_best_epoch_is_gone(tmp_path):
    n = train(tmp_path, "(Last(3))")
    with pytest.raises(CheckpointNotFound) as exc:
        average_checkpoints(tmp_path, "latest => Average(Best(2))")
    assert str(exc.value) == (
        f"Cannot average 'latest => Average(Best(2))' in {str(tmp_path)!r}: Best(2) names epochs "
        f"2, 4 of run {n.run_id}, which kept epochs 4, 5, 6 under keep=(Last(3)); it no longer "
        "holds 2. Keep them while training: Checkpointer(keep=(Last(3), Best(2)))."
    )
    # what the run does hold is averaged, and labelled by what it is
    ok = average_checkpoints(tmp_path, "latest => Average(Best(2; among=Last(3)))")
    assert ok.averaged_from["epochs"] == [4, 5]


def test_weights_average_uses_the_same_refusal(tmp_path):
    train(tmp_path, "(Best(2), Last(1))")
    with pytest.raises(CheckpointNotFound, match=r"Last\(3\) names epochs 4, 5, 6 of run"):
        Nitro(Scripted(), run_dir=tmp_path, weights="latest => Average(Last(3))")


def test_a_named_run_is_checked_the_same_way(tmp_path):
    first = train(tmp_path, "(Best(2), Last(1))")
    train(tmp_path, "(Last(6))")  # another run now writes last
    with pytest.raises(
        CheckpointNotFound, match=rf"of run {first.run_id}, which kept epochs 2, 4, 6"
    ):
        average_checkpoints(tmp_path, f"{first.run_id} => Average(Last(3))")
    assert average_checkpoints(tmp_path, "latest => Average(Last(3))").averaged_from["epochs"] == [
        4,
        5,
        6,
    ]


def test_a_resumed_run_drops_the_points_of_the_timeline_it_replaced(tmp_path):
    n = train(tmp_path, "(Best(1), Last(1))", scores=SCORES[:4])
    entries = read_manifest(tmp_path)
    second = next(e for e in entries if e.epoch == 2)
    assert [p.epoch for p in read_points(tmp_path)[n.run_id]] == [1, 2, 3, 4]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NitroWarning)
        b = Nitro(
            Scripted(keep="(Best(1), Last(1))", scores=SCORES[:4], max_epochs=3),
            run_dir=tmp_path,
            resume=str(tmp_path / second.file),
        ).train()
    assert [p.epoch for p in read_points(tmp_path)[b.run_id]] == [3]  # a branch: its own points


def test_weights_average_warns_about_a_changed_plain_config(tmp_path):
    train(tmp_path, "(Last(3))")
    with pytest.warns(NitroWarning) as caught:
        Nitro(Scripted(lr=0.01), run_dir=tmp_path, weights="latest => Average(Last(3))")
    texts = [str(w.message) for w in caught]
    assert any(
        t.startswith("weights from 'latest => Average(Last(3))' were trained under another config:")
        and "lr: 0.05 -> 0.01" in t
        for t in texts
    ), texts


@pytest.mark.parametrize(
    ("keep", "selector", "holds"),
    [
        ((Last(10),), Every(2), True),
        ((Last(10),), Epochs(range(2, 4)), True),
        ((Last(10),), Best(2), True),
        ((Last(10),), Last(6), True),
        ((Last(6),), Best(2), True),
        ((Last(5),), Best(2), False),
        ((Best(3), Last(1)), Best(2), True),
        ((Best(3), Last(1)), Best(4), False),
        ((Best(2), Last(1)), Last(3), False),
        ((Best(2), Last(3)), Last(3), True),
        ((Every(2), Last(1)), Every(4), True),
        ((Every(4),), Every(2), False),
        ((Epochs([2, 4, 6]),), Every(2), True),
        ((Last(2),), Best(1, among=Last(2)), True),
        ((Last(2),), Best(1, among=Last(3)), False),
        ((Last(1),), Epochs([9]), True),  # past max_epochs: the end-of-training warning's business
    ],
)
def test_a_keep_holds_what_a_selector_will_name_at_the_end(keep, selector, holds):
    assert keep_holds(keep, selector, last_epoch=6) is holds


@pytest.mark.parametrize(
    ("selector", "epochs"),
    [
        ("Average(Every(2))", [2, 4, 6]),
        ("Average(Epochs(2:3))", [2, 3]),
        ("Average(Best(2))", [2, 4]),
    ],
)
def test_restore_best_accepts_a_keep_that_holds_the_selection(tmp_path, selector, epochs):
    n = train(tmp_path, "(Last(10))", restore_best=selector)
    assert n.averaged_from["epochs"] == epochs
    expected = average_checkpoints(tmp_path, f"{n.run_id} => {selector}")
    for k, v in n.model.state_dict().items():
        assert torch.equal(v, expected.state[k]), k


def test_restore_best_refuses_a_keep_that_cannot_hold_the_selection(tmp_path):
    with pytest.raises(ConfigError) as exc:
        Nitro(Scripted(keep="(Best(2), Last(1))"), run_dir=tmp_path, restore_best=Average(Last(3)))
    assert str(exc.value) == (
        "restore_best=Average(Last(3)) needs records that keep=(Best(2), Last(1)) does not hold at "
        "the end of training (max_epochs=6). Keep them: "
        "Checkpointer(keep=(Best(2), Last(1), Last(3)))."
    )
    assert not list(tmp_path.iterdir())  # refused at setup, before anything was written
