"""Reading a record: the header parsed once, tensors made straight from the file's pages (no
copy), small ones in storage of their own, exactly the sections asked for read and verified,
and a truncated or malformed file refused before any tensor is made."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch

from nitro_core import CheckpointCorrupt
from nitro_core.store import reader, record_header
from nitro_core.store import recordio as store

from .. import by_hand

BIG = 100_000  # float32: 400 KB, made from the file's pages


def record(tmp_path):
    tensors = {
        "params/big": torch.arange(BIG, dtype=torch.float32),
        "params/small": torch.ones(3, dtype=torch.bfloat16),
        "optim/state/0/exp_avg": torch.full((BIG,), 2.0),
        "rng/torch": torch.get_rng_state(),
    }
    path = tmp_path / "r.safetensors"
    _, digest = store.write_record(path, tensors, {"step": 1})
    return path, digest, tensors


def test_a_read_parses_the_header_once_and_returns_every_tensor(tmp_path, monkeypatch):
    path, digest, tensors = record(tmp_path)
    parses = []
    real = json.loads
    monkeypatch.setattr(record_header.json, "loads", lambda s, *a, **k: parses.append(1) or real(s))
    loaded, meta = store.read_record(path, digest)
    assert len(parses) == 2  # the header, and the nitro metadata inside it
    assert loaded.keys() == tensors.keys() and meta["step"] == 1
    for name, t in tensors.items():
        assert torch.equal(loaded[name], t), name


def test_large_tensors_are_the_files_pages_and_small_ones_have_their_own_storage(tmp_path):
    path, digest, _ = record(tmp_path)
    loaded, _ = store.read_record(path, digest)
    big = loaded["params/big"]
    assert big.untyped_storage().nbytes() == path.stat().st_size  # a view of the mapping
    assert big.storage_offset() > 0
    rng = loaded["rng/torch"]
    assert rng.storage_offset() == 0 and rng.untyped_storage().nbytes() == rng.numel()
    torch.set_rng_state(rng)  # reads its storage from the start: it must be its own
    big.add_(1)  # pages are private: the file is untouched
    assert torch.equal(store.read_record(path, digest)[0]["params/big"][:3], torch.arange(3.0))


def test_a_read_of_some_sections_neither_reads_nor_verifies_the_others(tmp_path):
    path, digest, _ = record(tmp_path)
    begin, _ = by_hand.section_range(path, "optim")
    raw = bytearray(path.read_bytes())
    raw[begin] ^= 0xFF
    path.write_bytes(bytes(raw))
    loaded, _ = store.read_record(path, digest, {"params"})
    assert sorted(loaded) == ["params/big", "params/small"]
    with pytest.raises(CheckpointCorrupt) as exc:
        store.read_record(path, digest)
    assert "its 'optim' section digests to xxh3-128:" in str(exc.value)


def test_a_truncated_record_is_refused_before_any_tensor_is_made(tmp_path):
    path, digest, _ = record(tmp_path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointCorrupt) as exc:
        store.read_record(path, digest)
    assert str(exc.value) == (
        f"Checkpoint {str(path)!r} is truncated: it ends 100 bytes short of what its header "
        "describes. Load another checkpoint (read_manifest lists them)."
    )


def test_a_tensor_whose_bytes_do_not_match_its_shape_is_a_malformed_header(tmp_path):
    path = tmp_path / "bad.safetensors"
    meta = json.dumps({"step": 1})
    header = {
        "__metadata__": {"nitro": meta},
        "params/w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]},
    }
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"\0" * 8)
    with pytest.raises(CheckpointCorrupt) as exc:
        store.read_record(path)
    assert (
        str(exc.value) == f"Checkpoint {str(path)!r} has a malformed header at tensor 'params/w'."
    )


@pytest.mark.parametrize("threaded", [False, True])
def test_a_record_cut_short_after_it_was_opened_is_refused_by_a_stream(tmp_path, threaded):
    from concurrent.futures import ThreadPoolExecutor

    path, digest, _ = record(tmp_path)
    size = path.stat().st_size
    with reader.RecordFile(path, digest) as opened, ThreadPoolExecutor(1) as pool:
        os.truncate(path, size - 300_000)  # cut after the size was checked, several pieces short
        with pytest.raises(CheckpointCorrupt) as exc:
            for _ in opened.stream(piece_bytes=64 * 1024, hasher=pool if threaded else None):
                pass
    assert str(exc.value) == (
        f"Checkpoint {str(path)!r} is truncated: it ends 300000 bytes short of what its "
        "header describes. Load another checkpoint (read_manifest lists them)."
    )
