"""Budgets: ``max_steps`` and ``time_limit`` stop a run at the last checkpoint point within
them, its record written with ``stop_reason="budget"``, and ``resume="auto"`` continues it
bit for bit (run A == run B + run C)."""

from __future__ import annotations

import pytest

from nitro_core import ConfigError, Nitro, TrainingRefused, read_manifest
from nitro_core.training.budget import Budget, next_point
from tests.nitro_core.training.test_resume import assert_same_state

from ..steps import Steps
from ..tiny import KeepLast


class Clock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_step_budget_stops_at_the_last_point_the_next_gap_would_pass():
    budget = Budget(max_steps=10)
    budget.start(0)
    assert [budget.spent(s) for s in (4, 8)] == [False, True]  # 8 + 4 > 10: 8 is the last
    exact = Budget(max_steps=8)
    exact.start(0)
    assert [exact.spent(s) for s in (4, 8)] == [False, True]  # the point at the budget stops
    resumed = Budget(max_steps=12)
    resumed.start(8)  # a resumed run counts its steps from the run's start
    assert [resumed.spent(s) for s in (10, 12)] == [False, True]


def test_the_time_budget_leaves_a_margin_of_its_largest_gap_between_points():
    clock = Clock()
    budget = Budget(time_limit=10.0, clock=clock)
    budget.start(0)
    spent = []
    for gap in (2.0, 2.0, 2.0, 2.0):
        clock.now += gap
        spent.append(budget.spent(0))
    # at 6 s the next point (8 s) plus a quarter of a gap for its write stays under 10 s;
    # at 8 s, 8 + 1.25 * 2 passes it
    assert spent == [False, False, False, True]
    slow = Budget(time_limit=10.0, clock=clock)
    slow.start(0)
    clock.now += 1.0
    assert slow.spent(0) is False
    clock.now += 4.5  # one slow point widens the margin for every later one
    assert slow.spent(0) is True  # 5.5 + 1.25 * 4.5 passes 10


def test_max_steps_stops_with_budget_and_resume_auto_continues_exactly(tmp_path):
    a = Nitro(KeepLast(max_epochs=4), run_dir=tmp_path / "a").train()
    b = Nitro(KeepLast(max_epochs=4), run_dir=tmp_path / "b", max_steps=9).train()
    # 4 steps an epoch: the point at step 8 is the last within 9 steps
    assert (b.epoch, b.step, b.stop_reason) == (2, 8, "budget")
    (entry,) = [e for e in read_manifest(tmp_path / "b") if e.step == 8]
    assert entry.stop_reason == "budget"
    c = Nitro(KeepLast(max_epochs=4), run_dir=tmp_path / "b", resume="auto")
    assert (c.run_id, c.epoch, c.step) == (b.run_id, 2, 8)
    c.train()
    assert c.stop_reason == "completed"
    assert_same_state(a, c)


def test_max_steps_stops_at_a_mid_epoch_point_and_resumes_exactly(tmp_path):
    exp = Steps(max_epochs=2, every=3)
    a = Nitro(exp, run_dir=tmp_path / "a").train()
    b = Nitro(exp, run_dir=tmp_path / "b", max_steps=7).train()
    assert (b.step, b.stop_reason) == (6, "budget") and b.batch is not None  # mid-epoch
    c = Nitro(exp, run_dir=tmp_path / "b", resume="auto").train()
    assert_same_state(a, c)


def test_time_limit_stops_with_budget_at_its_first_point_and_resumes_exactly(tmp_path):
    a = Nitro(KeepLast(max_epochs=3), run_dir=tmp_path / "a").train()
    # a limit no point fits in: the run stops at its first point, its record written
    b = Nitro(KeepLast(max_epochs=3), run_dir=tmp_path / "b", time_limit=1e-6).train()
    assert (b.epoch, b.stop_reason) == (1, "budget")
    assert read_manifest(tmp_path / "b")[-1].stop_reason == "budget"
    c = Nitro(KeepLast(max_epochs=3), run_dir=tmp_path / "b", resume="auto", time_limit=1e6)
    c.train()
    assert (c.epoch, c.stop_reason) == (3, "completed")
    assert_same_state(a, c)


def test_a_run_at_its_max_steps_is_refused_with_what_to_write(tmp_path):
    Nitro(KeepLast(max_epochs=4), run_dir=tmp_path, max_steps=8).train()
    n = Nitro(KeepLast(max_epochs=4), run_dir=tmp_path, resume="auto", max_steps=8)
    with pytest.raises(TrainingRefused) as raised:
        n.train()
    assert str(raised.value) == (
        f"Run {n.run_id} in {str(tmp_path)!r} is at step 8, and max_steps=8 leaves no step to "
        "train. Raise max_steps above 8 (it counts the run's steps from its start), or leave it out."
    )


@pytest.mark.parametrize(
    ("keyword", "value", "text"),
    [
        ("max_steps", 0, "Nitro(max_steps=0): write a positive number of optimizer steps, e.g. "
         "max_steps=1000, or None for no step budget."),
        ("max_steps", True, "Nitro(max_steps=True): write a positive number of optimizer steps, "
         "e.g. max_steps=1000, or None for no step budget."),
        ("time_limit", 0, "Nitro(time_limit=0): write a positive number of seconds, e.g. "
         "time_limit=3600, or None for no time budget."),  # zero seconds: no budget to train in
        ("time_limit", -1.0, "Nitro(time_limit=-1.0): write a positive number of seconds, e.g. "
         "time_limit=3600, or None for no time budget."),
        ("time_limit", float("inf"), "Nitro(time_limit=inf): write a positive number of "
         "seconds, e.g. time_limit=3600, or None for no time budget."),
    ],
)  # fmt: skip
def test_a_bad_budget_is_refused_before_anything_is_built(tmp_path, keyword, value, text):
    with pytest.raises(ConfigError) as raised:
        Nitro(KeepLast(), run_dir=tmp_path, **{keyword: value})
    assert str(raised.value) == text
    assert not any(tmp_path.iterdir())  # nothing written


def test_the_next_point_is_known_from_the_epoch_length_and_every_steps():
    # Steps' defaults: 8 batches an epoch, a point every 3 steps: 3, 6, 8 | 9, 12, 15, 16
    assert next_point(0, 0, 8, 1, 3) == 3
    assert next_point(6, 6, 8, 1, 3) == 8  # the end, not 9: no mid-epoch point past it
    assert next_point(8, 8, 8, 1, 3) == 9  # at the end: the next epoch's first point
    assert next_point(15, 7, 8, 1, 3) == 16
    assert next_point(4, 4, 4, 1, None) == 8  # epoch ends only
    assert next_point(2, 4, 8, 2, 3) == 3  # two batches a step: 4 steps an epoch
    assert next_point(3, 6, 7, 2, 3) == 4  # a short last window steps too
    assert next_point(5, 5, None, 1, 3) is None  # a split without a length: estimated


def test_max_steps_takes_the_epoch_end_point_inside_the_budget(tmp_path):
    """The point at the epoch's end (step 8) is within max_steps=8: the run stops there, not
    at step 6 because the points were 3 steps apart."""
    b = Nitro(Steps(max_epochs=2), run_dir=tmp_path / "b", max_steps=8).train()
    assert (b.epoch, b.step, b.batch, b.stop_reason) == (1, 8, None, "budget")


def test_a_resume_with_the_same_max_steps_trains_nothing_past_it(tmp_path):
    """max_steps is the run's total across resumes: a re-sent call with the same budget is
    refused before a step (it once trained from 9 to 12 past max_steps=10), nothing on disk
    changes, and a raised budget continues it bit for bit."""
    exp = Steps(max_epochs=2)
    a = Nitro(exp, run_dir=tmp_path / "a").train()
    b = Nitro(exp, run_dir=tmp_path / "b", max_steps=10).train()
    assert (b.step, b.stop_reason) == (9, "budget")
    before = read_manifest(tmp_path / "b")
    again = Nitro(exp, run_dir=tmp_path / "b", resume="auto", max_steps=10)
    with pytest.raises(TrainingRefused) as raised:
        again.train()
    assert str(raised.value) == (
        f"Run {b.run_id} in {str(tmp_path / 'b')!r} is at step 9, its last checkpoint point "
        "within max_steps=10: the next point is at step 12. Raise max_steps to 12 or more (it "
        "counts the run's steps from its start), or leave it out."
    )
    assert read_manifest(tmp_path / "b") == before and again.step == 9
    c = Nitro(exp, run_dir=tmp_path / "b", resume="auto", max_steps=12).train()
    assert (c.step, c.stop_reason) == (12, "budget")
    d = Nitro(exp, run_dir=tmp_path / "b", resume="auto").train()
    assert d.stop_reason == "completed"
    assert_same_state(a, d)
