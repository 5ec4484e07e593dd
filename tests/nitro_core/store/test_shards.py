"""Record directories (several processes wrote them), made here in one process through the
same DCP storage layer: the header and digests, the readers, and corruption."""

from __future__ import annotations

import json
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from nitro_core.errors import CheckpointCorrupt
from nitro_core.store import recordio as store
from nitro_core.store import shards


def make(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor], str]:
    tensors = {
        "params/w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "optim/state/0/exp_avg": torch.ones(3, 4),
        "rng/torch": torch.arange(5, dtype=torch.uint8),
        "buffers/odd": torch.arange(3, dtype=torch.uint8),  # first by name, 3 bytes long
    }
    final = tmp_path / "epoch-0001-step-3"
    tmp = store.tmp_path(final)
    with warnings.catch_warnings():  # DCP: "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        digests = shards.write(tmp, tensors, main=True)
    size, tree = shards.publish(tmp, final, {"epoch": 1, "step": 3}, digests)
    assert size == sum(p.stat().st_size for p in final.iterdir())
    return final, tensors, tree


def test_a_record_directory_reads_back_whole_and_by_section(tmp_path: Path) -> None:
    final, tensors, tree = make(tmp_path)
    assert not store.tmp_path(final).exists() and shards.is_sharded(final)
    assert tree == shards.manifest_digest(final) and tree.startswith("xxh3-128-tree:")
    meta = store.read_header(final)  # the shard list is not meta; the header's digest is
    assert set(meta.pop("integrity")) == {"algorithm", "header"}
    assert meta == {"epoch": 1, "step": 3}
    got, meta = store.read_record(final, tree)
    assert meta["epoch"] == 1 and sorted(got) == sorted(tensors)
    for k, v in tensors.items():
        assert torch.equal(got[k], v), k
    with store.open_record_file(final, tree) as record:
        assert {t.name for t in record.tensors} == set(tensors)
        assert sorted(record.read({"params"})) == ["params/w"]
        pieces = list(record.stream({"params"}, piece_bytes=16))
        assert [first for _, first, _ in pieces] == [0, 4, 8]
        joined = torch.cat([p for _, _, p in pieces])
        assert torch.equal(joined, tensors["params/w"].reshape(-1))
        with ThreadPoolExecutor(1) as pool:  # as averaging streams records, files or not
            threaded = list(record.stream({"params"}, 16, pool))
        assert [(t.name, first) for t, first, _ in threaded] == [
            (t.name, first) for t, first, _ in pieces
        ]


def test_a_changed_header_or_shard_is_refused_naming_it(tmp_path: Path) -> None:
    final, _, tree = make(tmp_path)
    header = final / "header.json"
    original = header.read_bytes()
    changed = json.loads(original)
    changed["epoch"] = 2
    header.write_text(json.dumps(changed, sort_keys=True))
    with pytest.raises(CheckpointCorrupt) as e:
        store.read_record(final, tree)
    assert str(e.value) == (
        f"Checkpoint {str(final)!r}: its header.json does not match the manifest's digest "
        f"({tree.split(':')[0]}:{tree.split(':')[1][:16]}...); the record changed since it "
        "was written. Load another checkpoint."
    )
    header.write_bytes(original)
    shard = next(final.glob("shard-*.safetensors"))
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF  # a flipped bit in the tensor bytes
    shard.write_bytes(bytes(raw))
    for expected in (tree, None):  # listed or not, the shard is checked against the header
        with pytest.raises(CheckpointCorrupt) as e:
            store.read_record(final, expected)
        assert str(e.value) == (
            f"Checkpoint {str(final)!r}: shard {shard.name!r} does not match the digest its "
            "header gives; it changed since it was written. Load another checkpoint."
        )


def test_a_directory_without_a_header_is_not_a_record(tmp_path: Path) -> None:
    (tmp_path / "epoch-0001-step-3").mkdir()
    from nitro_core.errors import CheckpointMissing

    with pytest.raises(CheckpointMissing) as e:
        store.read_header(tmp_path / "epoch-0001-step-3")
    assert "is a directory without header.json, so not a committed sharded record" in str(e.value)


def test_retention_removes_a_record_directory_with_its_files(tmp_path: Path) -> None:
    final, _, _ = make(tmp_path)
    store.remove_file(final)
    assert not final.exists()
    store.remove_file(final)  # gone already is fine


def test_each_shards_digest_in_the_header_is_the_digest_of_its_bytes_on_disk(
    tmp_path: Path,
) -> None:
    final, _, _ = make(tmp_path)
    listed = json.loads((final / "header.json").read_bytes())["shards"]
    assert sorted(listed) == ["shard-00001-model-00001-of-00001.safetensors"]
    for name, value in listed.items():  # the writer hashed what it wrote, not a re-read
        assert value == shards._file_digest(final / name)


def test_a_shard_is_a_safetensors_file_on_dcps_layout(tmp_path: Path) -> None:
    from safetensors import safe_open

    final, tensors, _ = make(tmp_path)
    shard = final / "shard-00001-model-00001-of-00001.safetensors"
    with safe_open(str(shard), framework="pt") as f:
        assert sorted(f.keys()) == sorted(tensors)
        for k, v in tensors.items():
            assert torch.equal(f.get_tensor(k), v), k
        meta = f.metadata()
    assert meta["DCP_VERSION"] == "1.0" and meta["format"] == "pt"
    assert json.loads(meta["DCP_SHARDING_INFO"]) == {
        "params/w": {"saved_offsets": [0, 0]},
        "optim/state/0/exp_avg": {"saved_offsets": [0, 0]},
        "rng/torch": {"saved_offsets": [0]},
        "buffers/odd": {"saved_offsets": [0]},
    }
    raw = shard.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    entries = json.loads(raw[8 : 8 + length])
    for k, v in tensors.items():  # each piece starts where its element size divides
        assert (8 + length + entries[k]["data_offsets"][0]) % v.element_size() == 0, k


def test_publish_refuses_a_directory_holding_a_file_no_rank_wrote(tmp_path: Path) -> None:
    tmp = tmp_path / "epoch-0001-step-3.tmp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        digests = shards.write(tmp, {"params/w": torch.ones(2)}, main=True)
    (tmp / "shard-00002-model-00001-of-00001.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointCorrupt) as e:
        shards.publish(tmp, tmp_path / "epoch-0001-step-3", {}, digests)
    assert str(e.value) == (
        f"Record directory {str(tmp)!r} holds the files "
        "['shard-00001-model-00001-of-00001.safetensors', "
        "'shard-00002-model-00001-of-00001.safetensors'], the ranks wrote "
        "['shard-00001-model-00001-of-00001.safetensors']; another process wrote into it. "
        "Save the record again."
    )
    assert not (tmp_path / "epoch-0001-step-3").exists()


def test_a_sharded_record_leaf_that_is_not_a_tensor_is_refused(tmp_path: Path) -> None:
    from nitro_core.errors import RecordError

    with warnings.catch_warnings(), pytest.raises(RecordError) as e:
        warnings.simplefilter("ignore", UserWarning)
        shards.write(tmp_path / "r.tmp", {"params/w": torch.ones(2), "n": 3}, main=True)  # type: ignore[dict-item]
    assert str(e.value) == (
        "Record leaf 'n' is of type int, not a tensor; a sharded record holds tensors only "
        "(put other values in the record's JSON header)."
    )


def test_a_sharded_record_leaf_of_an_unstorable_dtype_is_refused_before_dcp_runs(
    tmp_path: Path,
) -> None:
    from nitro_core.errors import RecordError

    with pytest.raises(RecordError) as e:
        shards.write(tmp_path / "r.tmp", {"params/z": torch.ones(2, dtype=torch.complex64)}, True)
    assert str(e.value).startswith(
        "Record leaf 'params/z' has dtype torch.complex64, which safetensors cannot store; "
        "convert it to one of ["
    )
    assert not (tmp_path / "r.tmp").exists()  # refused before anything was written


def test_publish_takes_the_ranks_digests_and_reads_no_shard_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_read_back(path: Path) -> str:
        raise AssertionError(f"publish read {path.name} back")

    monkeypatch.setattr(shards, "_file_digest", no_read_back)
    final, _, tree = make(tmp_path)
    assert tree == shards.manifest_digest(final)


def test_a_shard_is_fsynced_before_its_header_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nitro_core.store import shard_writer

    synced: list[str] = []
    real = shard_writer.os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(shard_writer.os, "fsync", fsync)
    final, _, _ = make(tmp_path)
    tmp = store.tmp_path(final)  # the shard first, then publish's header and directories
    assert synced[:2] == [
        str(tmp / "shard-00001-model-00001-of-00001.safetensors"),
        str(tmp / "header.json"),
    ]


def test_an_average_of_record_files_and_record_directories_adds_like_tensors(
    tmp_path: Path,
) -> None:
    # a run that changed strategy holds both kinds; a file lists its tensors largest element
    # first, a directory by name: float16 and float32 parameters put them in other orders
    from nitro_core import average_checkpoints
    from nitro_core.state import records
    from nitro_core.store import manifest
    from nitro_core.store.manifest import ManifestEntry

    run = tmp_path / "run"
    run.mkdir()
    model = torch.nn.Sequential(torch.nn.Linear(3, 3).half(), torch.nn.Linear(3, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    entries, states = [], []
    for epoch in (1, 2, 3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(epoch)
        header = {"step": epoch, "epoch": epoch, "seed": 0, "run": "mixed001", "config": {},
                  "metrics": {"loss": 1.0 / epoch}, "stop_reason": None, "ema_meta": None}  # fmt: skip
        tensors, meta = records.encode(records.Snapshot(header=header, model=model, optimizer=opt))
        states.append({k: v.clone() for k, v in model.state_dict().items()})
        name = f"epoch-{epoch:04d}-step-{epoch}"
        if epoch == 2:  # the middle one written by several processes
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                digests = shards.write(store.tmp_path(run / name), tensors, main=True)
            size, tree = shards.publish(store.tmp_path(run / name), run / name, meta, digests)
        else:
            name += ".safetensors"
            size, tree = store.write_record(run / name, tensors, meta)
        entries.append(ManifestEntry(
            file=name, epoch=epoch, step=epoch, score=1.0 / epoch, metric="loss", mode="min",
            stop_reason=None, run="mixed001", written=manifest.now_iso(), bytes=size, digest=tree,
        ))  # fmt: skip
    with store.manifest_lock(run):
        manifest.save(run, manifest.Manifest(entries=entries))
    averaged = average_checkpoints(run, "latest => Average(Last(3))").state
    for key, value in averaged.items():
        mean = sum(s[key].double() for s in states) / 3
        assert torch.equal(value, mean.to(value.dtype)), key


def test_a_record_directory_written_before_header_digests_still_reads_and_verifies(
    tmp_path: Path,
) -> None:
    from nitro_core import verify

    final, tensors, _ = make(tmp_path)
    header = json.loads((final / "header.json").read_bytes())
    assert set(header.pop("integrity")) == {"algorithm", "header"}
    (final / "header.json").write_bytes(json.dumps(header, sort_keys=True).encode())
    assert store.read_header(final) == {"epoch": 1, "step": 3}  # no digest of its own: read
    got, _ = store.read_record(final)
    assert sorted(got) == sorted(tensors)
    (check,) = verify(final)
    assert (check.ok, check.listed, check.sections) == (
        True,
        False,
        sorted({k.split("/")[0] for k in tensors}),
    )


def test_rank_0_clears_a_leftover_directory_another_rank_s_writer_already_made(
    tmp_path, monkeypatch
):
    # DCP's writer makes the directory on every rank before the plans are gathered: rank 1 can
    # make it right after rank 0 cleared it, and rank 0 must then neither fail nor keep what a
    # killed write left
    tmp = tmp_path / "epoch-0001-step-3-loss=0.5.tmp"
    tmp.mkdir()
    (tmp / "shard-00001-model-00001-of-00001.safetensors").write_bytes(b"left by a killed write")
    clear = shards.remove_tree

    def cleared_then_made_by_rank_1(path):
        clear(path)
        path.mkdir()  # rank 1's prepare_local_plan, between rank 0's two steps

    monkeypatch.setattr(shards, "remove_tree", cleared_then_made_by_rank_1)
    shards._fresh(tmp)
    assert tmp.is_dir() and list(tmp.iterdir()) == []
