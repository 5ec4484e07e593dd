"""The one commit protocol (:mod:`nitro_core.store.atomic`): each finalizer makes the bytes
durable, publishes them in one step and makes the publishing durable, in that order, and
leaves no temporary behind. The steps are recorded from the real calls on real files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nitro_core.store import atomic, shards
from nitro_core.store import recordio as store

from .. import commit_steps

SHARD = "shard-00001-model-00001-of-00001.safetensors"


@pytest.fixture
def steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[commit_steps.Step]:
    return commit_steps.record(monkeypatch, tmp_path)


def test_a_replace_fsyncs_the_bytes_renames_over_the_name_then_fsyncs_the_directory(
    tmp_path: Path, steps: list[commit_steps.Step]
) -> None:
    path = tmp_path / "status.json"
    path.write_bytes(b"old")
    assert atomic.Replace(path).commit(lambda f: f.write(b"new")) == 3
    assert steps == [
        ("fsync", "status.json.tmp"),
        ("replace", "status.json.tmp", "status.json"),
        ("fsync", "."),
    ]
    assert path.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == [
        "status.json"
    ]


def test_a_reserved_record_is_fsynced_renamed_into_place_then_its_directory_fsynced(
    tmp_path: Path, steps: list[commit_steps.Step]
) -> None:
    path = tmp_path / "r.safetensors"
    reservation = store.reserve(path)
    assert reservation is not None and steps == []  # a fresh name: nothing set aside
    try:
        store.write_record(reservation, {"params/w": torch.ones(3)}, {"epoch": 1})
        assert store.in_flight(path)  # the lock followed the inode through the rename
    finally:
        reservation.release()
    assert steps == [
        ("fsync", "r.safetensors.tmp"),
        ("replace", "r.safetensors.tmp", "r.safetensors"),
        ("fsync", "."),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.safetensors"]


def test_a_new_name_is_published_by_a_link_after_its_bytes_are_fsynced_then_the_directory(
    tmp_path: Path, steps: list[commit_steps.Step]
) -> None:
    path = tmp_path / "avg.safetensors"
    store.write_record(path, {"params/w": torch.ones(3)}, {"epoch": 1})
    assert steps == [
        ("fsync", "avg.safetensors.tmp"),
        ("link", "avg.safetensors.tmp", "avg.safetensors"),
        ("fsync", "."),
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["avg.safetensors"]  # the .tmp unlinked
    assert torch.equal(store.read_record(path)[0]["params/w"], torch.ones(3))


def test_a_record_directory_is_renamed_once_its_header_and_entries_are_durable(
    tmp_path: Path, steps: list[commit_steps.Step]
) -> None:
    final = tmp_path / "epoch-0001-step-3"
    tmp = store.tmp_path(final)
    tmp.mkdir()
    (tmp / SHARD).write_bytes(b"a rank's shard, written and fsynced by that rank")
    shards.publish(tmp, final, {"epoch": 1, "step": 3}, {SHARD: "0" * 32})
    assert steps == [
        ("fsync", "epoch-0001-step-3.tmp/header.json"),
        ("fsync", "epoch-0001-step-3.tmp"),  # its entries, before the rename
        ("rename", "epoch-0001-step-3.tmp", "epoch-0001-step-3"),
        ("fsync", "."),
    ]
    assert sorted(p.name for p in final.iterdir()) == [shards.HEADER_NAME, SHARD]
