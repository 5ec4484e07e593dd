"""Every count in the grammar is bounded, and parsing stays linear in the text's length."""

from __future__ import annotations

import sys
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nitro_core import (
    Best,
    ConfigError,
    Epochs,
    Every,
    Last,
    SourceSyntaxError,
)
from nitro_core.policy.selectors import MAX_COUNT, MAX_EPOCHS, pick
from nitro_core.sources.grammar import MAX_LENGTH, parse_average, parse_keep, parse_source
from nitro_core.sources.selection import name_points
from nitro_core.store.manifest import ManifestEntry, Point

KEEP_HINT = "A keep reads like '(Best(3), Last(1))'."


def test_a_range_is_kept_by_its_ends_not_expanded():
    epochs = Epochs(range(1, MAX_COUNT + 1))
    assert epochs.epochs == range(1, MAX_COUNT + 1)
    assert sys.getsizeof(epochs.epochs) < 100
    assert 50_000 in epochs and 0 not in epochs and MAX_COUNT + 1 not in epochs


def test_consecutive_epochs_equal_the_same_range():
    assert Epochs([3, 4, 5]) == Epochs(range(3, 6)) == parse_keep("(Epochs(3:5))")[0]
    assert Epochs(5) == Epochs([5]) == Epochs(range(5, 6))
    assert hash(Epochs([3, 4, 5])) == hash(Epochs(range(3, 6)))
    assert Epochs([2, 4, 6]).epochs == (2, 4, 6)
    assert str(Epochs([6, 2, 4])) == "Epochs([6, 2, 4])"


def test_pick_by_epochs_tests_membership():
    entries = [
        ManifestEntry(
            file=f"e{i}.safetensors",
            epoch=i,
            step=i,
            score=None,
            metric="loss",
            mode="min",
            stop_reason=None,
            run="r1",
            written="2026-01-01T00:00:00Z",
            bytes=1,
            sha256="0" * 64,
        )  # fmt: skip
        for i in (1, 2, 7, 99_999, 100_001)
    ]
    assert [e.epoch for e in pick(Epochs(range(2, 100_001)), entries, "min")] == [2, 7, 99_999]
    assert [e.epoch for e in pick(Epochs([7, 1]), entries, "min")] == [1, 7]


def test_naming_the_largest_range_in_a_long_history_stays_linear():
    points = [Point(epoch=i, step=i) for i in range(1, 1001)]
    started = time.perf_counter()
    named, _ = name_points(Epochs(range(1, MAX_COUNT + 1)), points, (None, None))
    assert time.perf_counter() - started < 1.0  # a set of the range per point took ~4 s
    assert [p.epoch for p in named] == list(range(1, 1001))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: Epochs(range(1, 30_000_000)),
            "Epochs(1:29999999) names epoch 29999999; a run holds at most 1000000 epochs. Name "
            "epochs from 1 to 1000000; write Epochs(5), Epochs(range(3, 8)) or Epochs([2, 4, 6]).",
        ),
        (
            lambda: Epochs(range(1, 100_002)),
            "Epochs(1:100001) names 100001 epochs; a selector picks at most 100000 records. Name "
            "fewer, e.g. Epochs(1:100000).",
        ),
        (
            lambda: Epochs(iter(range(1, 10**12))),
            "Epochs(...) names more than 100000 epochs; a selector picks at most 100000 records. "
            "Write a range, e.g. Epochs(range(1, 100001)).",
        ),
        (
            lambda: Epochs([2, 10**7]),
            "Epochs([2, 10000000]) names epoch 10000000; a run holds at most 1000000 epochs. Name "
            "epochs from 1 to 1000000; write Epochs(5), Epochs(range(3, 8)) or Epochs([2, 4, 6]).",
        ),
        (
            lambda: Epochs(list(range(-60, 0))),
            "Epochs([-60, -59, -58, -57, -56, -55, -54, -...): give positive epoch numbers; write "
            "Epochs(5), Epochs(range(3, 8)) or Epochs([2, 4, 6]).",
        ),
        (
            lambda: Best(MAX_COUNT + 1),
            "Best(100001): k is at most 100000 (the most records a selector picks); write Best(3).",
        ),
        (
            lambda: Last(10**9),
            "Last(1000000000): k is at most 100000 (the most records a selector picks); write "
            "Last(3).",
        ),
        (
            lambda: Every(MAX_EPOCHS + 1),
            "Every(1000001): n is at most 1000000 (a run holds at most that many epochs); write "
            "Every(3).",
        ),
    ],
)
def test_selectors_refuse_counts_no_run_can_hold(build, message):
    with pytest.raises(ConfigError) as exc:
        build()
    assert str(exc.value) == message


def test_the_largest_counts_are_accepted():
    assert Best(MAX_COUNT).k == Last(MAX_COUNT).k == MAX_COUNT
    assert Every(MAX_EPOCHS).n == MAX_EPOCHS
    assert MAX_EPOCHS in Epochs(range(MAX_EPOCHS - MAX_COUNT + 1, MAX_EPOCHS + 1))


def test_a_long_keep_is_refused_by_length():
    text = "(" + "Best(1; among=" * 5000 + "Last(1)" + ")" * 5001
    with pytest.raises(SourceSyntaxError) as exc:
        parse_keep(text)
    assert str(exc.value) == f"Keep is {len(text)} characters long; the limit is 512. {KEEP_HINT}"


def test_a_deeply_nested_keep_is_a_parse_error_not_a_recursion_error():
    text = "(" + "Best(1;among=" * 33 + "Last(1)" + ")" * 34
    assert len(text) <= MAX_LENGTH
    with pytest.raises(SourceSyntaxError) as exc:
        parse_keep(text)
    assert str(exc.value) == (
        f"Cannot parse keep {text!r}: at position {1 + 13 * 32} found 'Best', expected a "
        f"selector nested at most 32 deep in among=. {KEEP_HINT}"
    )
    depth_32 = "(" + "Best(1;among=" * 31 + "Last(1)" + ")" * 32
    assert str(parse_keep(depth_32)[0]).count("among=") == 31


def test_parse_keep_names_the_keep_in_its_errors():
    with pytest.raises(SourceSyntaxError) as exc:
        parse_keep("(Last(1000000))")
    assert str(exc.value) == (
        "Cannot parse keep '(Last(1000000))': at position 6 found '1000000', expected a positive "
        f"integer up to 100000 (the most records a selector picks). {KEEP_HINT}"
    )


# -- properties ----------------------------------------------------------------------------------
def _int(limit: int) -> st.SearchStrategy[str]:
    return st.integers(1, limit).map(str)


def _selector(depth: int = 0) -> st.SearchStrategy[str]:
    leaves = st.one_of(
        _int(MAX_COUNT).map(lambda k: f"Last({k})"),
        _int(MAX_COUNT).map(lambda k: f"Best({k})"),
        _int(MAX_EPOCHS).map(lambda n: f"Every({n})"),
        _int(MAX_EPOCHS).map(lambda e: f"Epochs({e})"),
        st.tuples(st.integers(1, MAX_EPOCHS - MAX_COUNT), st.integers(0, MAX_COUNT - 1)).map(
            lambda t: f"Epochs({t[0]}:{t[0] + t[1]})"
        ),
        st.lists(_int(MAX_EPOCHS), min_size=1, max_size=40).map(
            lambda v: "Epochs([" + ", ".join(v) + "])"
        ),
    )
    if depth >= 3:
        return leaves
    nested = st.tuples(_int(MAX_COUNT), st.deferred(lambda: _selector(depth + 1))).map(
        lambda t: f"Best({t[0]}; among={t[1]})"
    )
    return st.one_of(leaves, nested)


ACCEPTED = st.tuples(
    st.sampled_from(["latest", "all", "a1b2c3d4", "'my run'"]),
    _selector(),
    st.sampled_from(["", ", state=best", ", state=latest"]),
).map(lambda t: f"{t[0]} => Average({t[1]}{t[2]})")


@settings(max_examples=300, deadline=500)
@given(ACCEPTED)
def test_parsing_an_accepted_source_takes_memory_linear_in_its_length(text):
    if len(text) > MAX_LENGTH:
        return
    tracemalloc.start()
    try:
        parsed = parse_source(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(parsed.pick) == text.split(" => ", 1)[1]  # prints back: nothing was lost
    assert peak < 2_000 * len(text) + 50_000, (peak, text)


def test_the_worst_accepted_range_is_as_cheap_as_a_small_one():
    def peak(text: str) -> int:
        tracemalloc.start()
        try:
            parse_source(text)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = (
        peak("latest => Average(Epochs(1:2))"),
        peak("latest => Average(Epochs(1:100000))"),
    )
    assert large < small + 10_000


NEAR_GRAMMAR = st.sampled_from(
    ["latest", "all", "=>", "Average", "(", ")", "Best", "Last", "Every", "Epochs", "among", "=",
     ";", ",", "[", "]", ":", "3", "0", "-1", "100000", "1000001", "9" * 30, "state", "best", " ",
     '"', "Best(1;among=", "Epochs(1:", "\x00", "é"]
)  # fmt: skip


def _parses_or_refuses(parse, text: str) -> None:
    try:
        parse(text)
    except (SourceSyntaxError, ConfigError):
        pass  # anything else (RecursionError, MemoryError, TypeError) fails the test


@settings(max_examples=300, deadline=500)
@given(st.lists(NEAR_GRAMMAR, max_size=80).map("".join))
def test_any_near_grammatical_text_parses_or_raises_a_nitro_error(text):
    _parses_or_refuses(parse_source, "latest => Average(" + text)
    _parses_or_refuses(parse_average, "Average(" + text)
    _parses_or_refuses(parse_keep, "(" + text)


@settings(max_examples=200, deadline=500)
@given(st.text(max_size=600))
def test_any_text_is_a_keep_or_a_parse_error(text):
    _parses_or_refuses(parse_keep, text)
    _parses_or_refuses(parse_average, text)
