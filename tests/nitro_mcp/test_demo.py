"""``nitro demo``'s payoff line: the best checkpoint's validation beside the average's. The
whole demo runs in tests/test_dev_script.py (slow: a fresh install, a real server over stdio)."""

from __future__ import annotations

from nitro_mcp.demo import comparison


def test_the_comparison_puts_each_shared_metric_of_the_best_beside_the_average():
    text = comparison({"acc": 0.8047, "loss": 0.41}, {"acc": 0.8203, "loss": 0.395, "extra": 1.0})
    assert text.splitlines() == [
        "",
        "Validation, the best checkpoint against the average of the last 3:",
        "  acc        best 0.8047   average 0.8203   (+0.0156)",
        "  loss       best 0.4100   average 0.3950   (-0.0150)",
    ]


def test_a_validation_that_did_not_finish_is_said_instead_of_a_comparison():
    expected = "\nNo comparison: a validation did not finish (see its error above)."
    assert comparison({"acc": 0.8}, None) == expected
    assert comparison(None, {"acc": 0.8}) == expected
