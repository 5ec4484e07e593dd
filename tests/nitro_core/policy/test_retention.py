"""Retention keeps the union of the selectors over the entries it governs, and nothing else
is ever ranked or deleted."""

from __future__ import annotations

from nitro_core import (
    Best,
    Checkpointer,
    Every,
    Last,
)
from nitro_core.policy.retention import keep_reasons, plan, would_keep
from tests.nitro_core.policy.test_selectors import entry

LOSS = ("loss", "min")


def test_union_of_selectors_is_kept_and_the_rest_deleted():
    entries = [entry(i + 1, s) for i, s in enumerate([0.5, 0.3, 0.4, 0.1, 0.9, 0.2])]
    p = plan(entries, Checkpointer(keep=(Best(2), Last(1), Every(3))), "r1", LOSS)
    assert sorted(p.keep) == ["e3-r1.safetensors", "e4-r1.safetensors", "e6-r1.safetensors"]
    assert p.keep["e6-r1.safetensors"] == ("Best(2): #2 by loss (min)", "Last(1)", "Every(3)")
    assert p.keep["e3-r1.safetensors"] == ("Every(3)",)
    assert sorted(p.delete) == ["e1-r1.safetensors", "e2-r1.safetensors", "e5-r1.safetensors"]


def test_best_never_evicts_the_latest():
    entries = [entry(1, 0.1), entry(2, 0.2), entry(3, 0.9)]
    p = plan(entries, Checkpointer(keep=(Best(1), Last(1))), "r1", LOSS)
    assert set(p.keep) == {"e1-r1.safetensors", "e3-r1.safetensors"}


def test_an_epoch_is_written_only_if_some_selector_keeps_it():
    entries = [entry(1, 0.1), entry(2, 0.2)]
    best_only = Checkpointer(keep=Best(2))
    assert not would_keep(entries, entry(3, 0.5), best_only, "r1", LOSS)
    assert would_keep(entries, entry(3, 0.15), best_only, "r1", LOSS)
    assert would_keep(entries, entry(3, 0.5), Checkpointer(keep=(Best(2), Last(1))), "r1", LOSS)
    assert not would_keep(entries, entry(3, 0.5), Checkpointer(keep=Every(2)), "r1", LOSS)


def test_scope_run_never_touches_another_runs_entries():
    entries = [entry(1, 0.1, run="other"), entry(1, 0.5, run="r1"), entry(2, 0.6, run="r1")]
    p = plan(entries, Checkpointer(keep=Last(1)), "r1", LOSS)
    assert "e1-other.safetensors" not in p.delete and "e1-other.safetensors" not in p.keep
    assert p.delete == ("e1-r1.safetensors",)


def test_scope_dir_ranks_and_deletes_across_runs():
    entries = [entry(1, 0.1, run="other"), entry(1, 0.5, run="r1"), entry(2, 0.6, run="r1")]
    p = plan(entries, Checkpointer(keep=(Best(1), Last(1)), scope="dir"), "r1", LOSS)
    assert set(p.keep) == {"e1-other.safetensors", "e2-r1.safetensors"}
    assert p.delete == ("e1-r1.safetensors",)


def test_entries_under_another_metric_are_never_ranked_or_deleted():
    old = [entry(i, 0.9 - i / 10, metric="acc", mode="max") for i in (1, 2)]
    new = [entry(3, 0.4), entry(4, 0.3)]
    p = plan(old + new, Checkpointer(keep=(Best(1), Last(1))), "r1", LOSS)
    assert set(p.keep) == {"e4-r1.safetensors"}
    assert p.delete == ("e3-r1.safetensors",)
    assert keep_reasons(new, Checkpointer(keep=Best(1)), LOSS) == {
        "e4-r1.safetensors": ["Best(1): #1 by loss (min)"]
    }


def test_explain_reads_the_recorded_keep_back_with_the_grammar(tmp_path):
    from nitro_core import Nitro, read_manifest
    from nitro_core.examples import Classifier
    from nitro_core.policy.retention import explain
    from nitro_core.sources.grammar import parse_keep

    assert parse_keep("(Best(3), Last(1))") == (Best(3), Last(1))
    assert parse_keep("(Every(2))") == (Every(2),)
    n = Nitro(Classifier(max_epochs=4, samples=256), run_dir=tmp_path).train()
    entries = read_manifest(tmp_path)
    why = explain(entries, n.run_id)
    assert set(why) == {e.file for e in entries}
    assert all(reasons for reasons in why.values())
    assert "Last(3)" in why[entries[-1].file]


def test_retention_under_mode_max_keeps_the_highest_scores():
    scores = [0.5, 0.9, 0.1, 0.7]
    entries = [entry(i + 1, s, metric="acc", mode="max") for i, s in enumerate(scores)]
    p = plan(entries, Checkpointer(keep=Best(2)), "r1", ("acc", "max"))
    assert p.keep == {
        "e2-r1.safetensors": ("Best(2): #1 by acc (max)",),
        "e4-r1.safetensors": ("Best(2): #2 by acc (max)",),
    }
    assert sorted(p.delete) == ["e1-r1.safetensors", "e3-r1.safetensors"]
