"""Two ranks write a sharded record through :class:`nitro_core.store.shard_writer.ShardWriter`
(``dcp.save`` and ``async_save``): each rank hashes its own shard, rank 0 publishes the
digests DCP gathered, and those are the digests of the files' bytes on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nitro_core.errors import CheckpointCorrupt
from nitro_core.store import recordio as store
from nitro_core.store import shards
from tests.nitro_core.distributed.conftest import assert_equal_tensors, tensors

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("shard_script.py")
SHARDS = [
    "shard-00001-model-00001-of-00001.safetensors",
    "shard-00002-model-00001-of-00001.safetensors",
]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(SCRIPT), str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        pytest.fail(f"torchrun failed ({done.returncode}):\n{done.stderr[-6000:]}")
    return out


@pytest.mark.parametrize("how", ["sync", "async"])
def test_the_digests_rank_0_publishes_are_each_shards_bytes_on_disk(
    written: Path, how: str
) -> None:
    record = written / how
    assert sorted(p.name for p in record.iterdir()) == ["header.json", *SHARDS]
    listed = json.loads((record / "header.json").read_bytes())["shards"]
    assert sorted(listed) == SHARDS  # rank 1's digest came to rank 0 through DCP's gather
    for name, value in listed.items():
        assert value == shards._file_digest(record / name), name
    got, meta = store.read_record(record, shards.manifest_digest(record))
    assert meta["step"] == {"sync": 1, "async": 2}[how]
    assert_equal_tensors(got, tensors(written / "full.safetensors"))


def test_a_corrupted_shard_of_another_rank_is_detected(written: Path, tmp_path: Path) -> None:
    record = tmp_path / "copy"
    os.system(f"cp -r {written / 'sync'} {record}")
    shard = record / SHARDS[1]  # rank 1 wrote and hashed it
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0x01
    shard.write_bytes(bytes(raw))
    with pytest.raises(CheckpointCorrupt) as e:
        store.read_record(record, shards.manifest_digest(record))
    assert str(e.value) == (
        f"Checkpoint {str(record)!r}: shard {SHARDS[1]!r} does not match the digest its "
        "header gives; it changed since it was written. Load another checkpoint."
    )
