"""The manifest lists kept records; lookups read it alone."""

from __future__ import annotations

import json

import pytest

from nitro_core import (
    CheckpointCorrupt,
    Nitro,
    read_manifest,
    runs,
)

from .. import by_hand
from ..tiny import KeepLast, Tiny

FIELDS = {
    "file",
    "epoch",
    "batch",
    "step",
    "score",
    "metric",
    "mode",
    "stop_reason",
    "run",
    "parent",
    "written",
    "keep",
    "bytes",
    "digest",
}


def test_manifest_entries_carry_every_field_and_match_the_files(tmp_path):
    n = Nitro(KeepLast(), run_dir=tmp_path).train()
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["format"] == "nitro-manifest/1"
    assert [set(e) for e in data["entries"]] == [FIELDS, FIELDS]
    for e in read_manifest(tmp_path):
        path = tmp_path / e.file
        assert e.bytes == path.stat().st_size and e.digest == by_hand.tree(path)
        assert (e.metric, e.mode, e.run, e.parent) == ("loss", "min", n.run_id, None)
    assert [e.epoch for e in read_manifest(tmp_path)] == [2, 3]
    assert [e.stop_reason for e in read_manifest(tmp_path)] == [None, "completed"]


def test_runs_lists_each_run_once_in_order(tmp_path):
    a = Nitro(Tiny(max_epochs=1), run_dir=tmp_path).train()
    b = Nitro(Tiny(max_epochs=1), run_dir=tmp_path, seed=1).train()
    assert runs(tmp_path) == [a.run_id, b.run_id]


def test_a_nan_score_in_the_manifest_is_refused_when_read(tmp_path):
    Nitro(KeepLast(max_epochs=1), run_dir=tmp_path).train()
    text = (tmp_path / "manifest.json").read_text()
    data = json.loads(text)
    data["entries"][0]["score"] = float("nan")
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointCorrupt) as exc:
        read_manifest(tmp_path)
    assert "score nan is not finite" in str(exc.value)


def test_no_tmp_file_is_left_after_commits(tmp_path):
    Nitro(KeepLast(), run_dir=tmp_path).train()
    assert not [p for p in tmp_path.rglob("*.tmp")]
