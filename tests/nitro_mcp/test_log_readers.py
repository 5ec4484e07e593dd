"""``nitro_history``/``nitro_plot`` (``observe``) and ``nitro_compare`` (``catalog``) read
the metrics log through the core's one reader, under its one size limit: a log past it is
read by its end for a history, and stands aside for the record's history in a comparison
(whose wall time sums every row)."""

from __future__ import annotations

from nitro_core.store import metrics_log
from nitro_core.store.metrics_log import JSONLLogger
from nitro_mcp import catalog, observe


def test_history_and_compare_share_the_readers_limit(tmp_path, monkeypatch):
    logger = JSONLLogger()
    logger.open(tmp_path, "abcd1234", None)
    rows = [{"epoch": e, "step": e, "val": {"loss": 0.5}, "seconds": 1.0} for e in (1, 2, 3, 4)]
    for row in rows:
        logger.log(row)
    logger.close()
    assert observe.read_log(tmp_path, "abcd1234").cut is False
    assert catalog._log_rows(tmp_path, "abcd1234") == rows
    monkeypatch.setattr(metrics_log, "READ_MAX", 100)  # the one limit, lowered for both
    history = observe.read_log(tmp_path, "abcd1234")
    assert history.cut and [r["epoch"] for r in history.rows] == [4]
    assert catalog._log_rows(tmp_path, "abcd1234") == []  # the record's history stands in
