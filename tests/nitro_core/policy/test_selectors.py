"""Selectors pick from manifest entries; Checkpointer refuses what cannot work."""

from __future__ import annotations

import warnings

import pytest

from nitro_core import (
    Best,
    Checkpointer,
    ConfigError,
    Epochs,
    Every,
    Last,
    NitroDeprecationWarning,
)
from nitro_core.policy.selectors import _warn_topk_once, pick
from nitro_core.store.manifest import ManifestEntry


def entry(
    epoch: int, score: float | None, run: str = "r1", metric: str = "loss", mode: str = "min"
):
    return ManifestEntry(
        file=f"e{epoch}-{run}.safetensors", epoch=epoch, step=10 * epoch, score=score, metric=metric,
        mode=mode, stop_reason=None, run=run, written="2026-01-01T00:00:00Z", bytes=1, sha256="0" * 64,
    )  # fmt: skip


SCORES = [0.5, 0.3, 0.4, 0.1, 0.9, 0.2]  # epochs 1..6
ENTRIES = [entry(i + 1, s) for i, s in enumerate(SCORES)]


@pytest.mark.parametrize(
    ("selector", "mode", "epochs"),
    [
        (Last(1), "min", [6]),
        (Last(3), "min", [4, 5, 6]),
        (Last(10), "min", [1, 2, 3, 4, 5, 6]),
        (Best(1), "min", [4]),
        (Best(2), "min", [4, 6]),
        (Best(2), "max", [1, 5]),
        (Every(2), "min", [2, 4, 6]),
        (Every(4), "min", [4]),
        (Epochs(3), "min", [3]),
        (Epochs(range(2, 5)), "min", [2, 3, 4]),
        (Epochs([1, 6, 9]), "min", [1, 6]),
        (Best(1, among=Last(3)), "min", [4]),
        (Best(2, among=Last(2)), "max", [5, 6]),
        (Best(1, among=Epochs([1, 2])), "min", [2]),
        (Best(3), None, []),
    ],
)
def test_pick_chooses_by_the_selector_rule(selector, mode, epochs):
    assert [e.epoch for e in pick(selector, ENTRIES, mode)] == epochs


def test_best_ties_keep_the_earlier_entry():
    tied = [entry(1, 0.2), entry(2, 0.2), entry(3, 0.2)]
    assert [e.epoch for e in pick(Best(1), tied, "min")] == [1]


def test_best_ignores_unscored_entries():
    mixed = [entry(1, None), entry(2, 0.4), entry(3, None)]
    assert [e.epoch for e in pick(Best(3), mixed, "min")] == [2]


def test_selectors_print_in_the_source_grammar():
    assert str(Best(5, among=Last(20))) == "Best(5; among=Last(20))"
    assert str(Epochs(range(3, 8))) == "Epochs(3:7)"
    assert str(Epochs([2, 4, 6])) == "Epochs([2, 4, 6])"
    assert str(Checkpointer()) == "(Best(3), Last(1))"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Last(0), "Last(0): k must be a positive integer; write Last(3)."),
        (lambda: Best(-1), "Best(-1): k must be a positive integer; write Best(3)."),
        (lambda: Every(True), "Every(True): n must be a positive integer; write Every(3)."),
        (
            lambda: Epochs([0, 2]),
            "Epochs([0, 2]): give positive epoch numbers; write Epochs(5), Epochs(range(3, 8)) or Epochs([2, 4, 6]).",
        ),
        (
            lambda: Checkpointer(keep=()),
            "Checkpointer(keep=()) keeps nothing; write Checkpointer(keep=Last(1)), or return None from checkpointer() to write no checkpoints.",
        ),
        (
            lambda: Checkpointer(keep=("best",)),
            "Checkpointer(keep=...) got 'best', which is not a selector; write Best(k), Last(k), Every(n) or Epochs(...), e.g. keep=(Best(3), Last(1)).",
        ),
        (
            lambda: Checkpointer(keep=Best(3, among=Last(10))),
            "Checkpointer(keep=Best(3; among=Last(10))): among is for loading only; while training keep both instead: keep=(Best(3), Last(10)).",
        ),
        (
            lambda: Checkpointer(metric="acc"),
            "Checkpointer(metric='acc') gives one of metric and mode; give both, e.g. Checkpointer(metric='acc', mode='max'), or neither to rank by the monitor.",
        ),
        (
            lambda: Checkpointer(metric="acc", mode="up"),
            "Checkpointer(mode='up'): mode is 'min' or 'max'.",
        ),
        (lambda: Checkpointer(scope="all"), "Checkpointer(scope='all'): scope is 'run' or 'dir'."),
    ],
)
def test_bad_selectors_and_checkpointers_are_refused_with_what_to_write(build, message):
    with pytest.raises(ConfigError) as exc:
        build()
    assert str(exc.value) == message


def test_single_selector_keep_is_normalized_to_a_tuple():
    assert Checkpointer(keep=Last(5)).keep == (Last(5),)


def test_topk_checkpointer_builds_the_equivalent_and_warns_once_per_session():
    from nitro_core import TopKCheckpointer

    _warn_topk_once.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = TopKCheckpointer(k=2, metric="acc", mode="max", scope="dir", name="m")
        second = TopKCheckpointer(k=5, keep_latest=False)
    deprecations = [w for w in caught if issubclass(w.category, NitroDeprecationWarning)]
    assert len(deprecations) == 1
    assert "TopKCheckpointer is deprecated" in str(deprecations[0].message)
    assert first == Checkpointer(
        keep=(Best(2), Last(1)), metric="acc", mode="max", scope="dir", name="m"
    )
    assert (first.k, first.keep_latest) == (2, 1)
    assert second.keep == (Best(5),) and (second.k, second.keep_latest) == (5, 0)
