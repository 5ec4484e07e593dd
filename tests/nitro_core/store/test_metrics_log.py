"""The JSONL metrics log: its writer (``JSONLLogger``) and its one reader
(:func:`nitro_core.store.metrics_log.read_log`), which ``nitro_history``, ``nitro_plot``
and ``nitro_compare`` all read through, under one size limit."""

from __future__ import annotations

import os

import pytest

from nitro_core.errors import UnsafePath
from nitro_core.store import metrics_log
from nitro_core.store.metrics_log import JSONLLogger, read_log
from nitro_core.store.safeio import link_refusal


def logged(run_dir, rows, tail: bytes = b"") -> None:
    logger = JSONLLogger()
    logger.open(run_dir, "abcd1234", None)
    for row in rows:
        logger.log(row)
    logger.close()
    with open(run_dir / "logs" / "abcd1234.jsonl", "ab") as f:
        f.write(tail)


def test_the_reader_reads_what_the_writer_wrote_and_skips_what_is_no_row(tmp_path):
    rows = [{"epoch": e, "step": 2 * e, "val": {"loss": 1.0 / e}} for e in (1, 2, 3)]
    logged(tmp_path, rows[:2], b"not json\n[1, 2]\n")
    logged(tmp_path, rows[2:], b'{"epoch": 4, "st')  # a row still being written
    log = read_log(tmp_path, "abcd1234")
    assert log == metrics_log.LogRows(rows, skipped=2, cut=False)


def test_past_the_limit_only_the_end_is_read_without_its_cut_first_line(tmp_path, monkeypatch):
    rows = [{"epoch": e, "pad": "x" * 40} for e in range(1, 11)]
    logged(tmp_path, rows)
    size = os.path.getsize(tmp_path / "logs" / "abcd1234.jsonl")
    monkeypatch.setattr(metrics_log, "READ_MAX", size // 2)
    log = read_log(tmp_path, "abcd1234")
    assert log.cut and log.skipped == 0 and log.rows == rows[-len(log.rows) :]
    assert 3 <= len(log.rows) < 5


def test_a_link_or_a_fifo_in_the_logs_place_is_refused(tmp_path):
    (tmp_path / "logs").mkdir()
    path = tmp_path / "logs" / "abcd1234.jsonl"
    os.mkfifo(path)
    with pytest.raises(UnsafePath) as exc:
        read_log(tmp_path, "abcd1234")
    assert str(exc.value) == str(link_refusal(path))
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(UnsafePath) as exc:
        read_log(tmp_path, "abcd1234")
    assert str(exc.value) == str(link_refusal(path))
    with pytest.raises(FileNotFoundError):
        read_log(tmp_path, "00000000")
