"""FSDP2 through torchrun (gloo on CPU): sharded record directories written through
torch.distributed.checkpoint, exact resume on the same world size, resharding to another,
reading a sharded record in one process, and a rank killed mid-write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nitro_core import (
    Nitro,
    average_checkpoints,
    checkpoint_info,
    export_weights,
    read_manifest,
)
from nitro_core.examples import Regression
from nitro_core.store import recordio as store
from nitro_core.store import shards
from tests.nitro_core.distributed.conftest import (
    SCRIPT,
    assert_both_ranks_stopped_on_rank_0s_failed_write,
    assert_equal_tensors,
    one_process,
    rank_pids,
    tensors,
    torchrun,
)

pytestmark = pytest.mark.slow


def test_fsdp_records_are_directories_of_safetensors_shards_and_a_json_header(
    tmp_path: Path,
) -> None:
    torchrun(2, tmp_path, 2, "false", "fsdp")
    entries = read_manifest(tmp_path)
    assert [e.epoch for e in entries] == [1, 2]
    record = tmp_path / entries[-1].file
    assert record.is_dir() and not entries[-1].file.endswith(".safetensors")
    names = sorted(p.name for p in record.iterdir())
    assert names == [
        "header.json",
        "shard-00001-model-00001-of-00001.safetensors",
        "shard-00002-model-00001-of-00001.safetensors",
    ]  # no pickled .metadata
    assert entries[-1].bytes == sum(p.stat().st_size for p in record.iterdir())
    assert entries[-1].digest == shards.manifest_digest(record)
    meta = store.read_header(record)
    assert meta["distributed"] == {"world": 2, "strategy": "fsdp"} and meta["epoch"] == 2
    info = checkpoint_info(record)
    assert info["epoch"] == 2


def test_fsdp_resume_on_two_ranks_is_exact_and_on_one_loads_the_saved_parameters(
    tmp_path: Path,
) -> None:
    a, bc, one = tmp_path / "a", tmp_path / "bc", tmp_path / "one"
    torchrun(2, a, 4, "false", "fsdp")
    torchrun(2, bc, 2, "false", "fsdp")
    saved = tensors(bc / "final-2-false-fsdp-w2-rank0.safetensors")
    os.system(f"cp -r {bc} {one}")  # the same record, resumed on one process
    torchrun(2, bc, 4, "auto", "fsdp")
    assert_equal_tensors(tensors(bc / "loaded-4-auto-fsdp-w2-rank1.safetensors"), saved)
    for rank in (0, 1):
        assert_equal_tensors(
            tensors(a / f"final-4-false-fsdp-w2-rank{rank}.safetensors"),
            tensors(bc / f"final-4-auto-fsdp-w2-rank{rank}.safetensors"),
        )
    done = one_process(one, 3, "auto", "auto")  # no torchrun: a plain module
    assert "written by 2 process(es), on 1" in done.stderr
    assert_equal_tensors(tensors(one / "loaded-3-auto-auto-w1-rank0.safetensors"), saved)
    assert [e.epoch for e in read_manifest(one)] == [1, 2, 3]


def test_a_sharded_record_loads_exactly_into_fsdp_on_a_group_of_one(tmp_path: Path) -> None:
    torchrun(2, tmp_path, 2, "false", "fsdp")
    saved = tensors(tmp_path / "final-2-false-fsdp-w2-rank0.safetensors")
    torchrun(1, tmp_path, 3, "auto", "fsdp")
    assert_equal_tensors(tensors(tmp_path / "loaded-3-auto-fsdp-w1-rank0.safetensors"), saved)


def test_weights_export_and_averaging_read_sharded_records(tmp_path: Path) -> None:
    torchrun(2, tmp_path, 3, "false", "fsdp")
    entries = read_manifest(tmp_path)
    full = [store.read_record(tmp_path / e.file)[0] for e in entries]
    averaged = average_checkpoints(tmp_path, "latest => Average(Last(3))")
    for name in (k.removeprefix("params/") for k in full[0] if k.startswith("params/")):
        mean = sum(f[f"params/{name}"].double() for f in full) / 3
        assert torch.equal(averaged.state[name], mean.to(averaged.state[name].dtype)), name
    # weights= takes a record directory by its path (ending in "/") in one process
    n = Nitro(Regression(samples=520, batch_size=32), run_dir=tmp_path / "w",
              weights=f"{tmp_path / entries[-1].file}/")  # fmt: skip
    for name, value in n.model.state_dict().items():
        assert torch.equal(value, full[-1][f"params/{name}"]), name
    out = tmp_path / "export.safetensors"
    export_weights("latest => latest", out, run_dir=tmp_path)
    exported = tensors(out)
    for name, value in exported.items():
        assert torch.equal(value, full[-1][f"params/{name}"]), name


def test_killing_a_rank_mid_write_leaves_the_manifest_and_the_previous_records(
    tmp_path: Path,
) -> None:
    torchrun(2, tmp_path, 2, "false", "fsdp")
    before = read_manifest(tmp_path)
    # a third epoch whose write stalls inside DCP on every rank until the test kills one
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NITRO_TEST_SLOW_SHARD_WRITE": "600"}
    child = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(SCRIPT), str(tmp_path), "3", "auto", "fsdp"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    marker = tmp_path / "inside-write-rank1"
    deadline = time.monotonic() + 600
    while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the third epoch's write never started"
    assert [p.name for p in tmp_path.glob("epoch-0003*.tmp")], "no partial record to kill"
    ranks = rank_pids(child.pid)
    assert sorted(ranks) == [0, 1], ranks
    os.kill(ranks[1], signal.SIGKILL)  # rank 1, inside its shard write
    child.wait(timeout=600)
    assert child.returncode != 0
    assert read_manifest(tmp_path) == before
    for e in before:
        store.read_record(tmp_path / e.file, e.expected)  # intact, digests checked
    # the next launch resumes from the previous record; the partial directory is never used
    torchrun(2, tmp_path, 3, "auto", "fsdp")
    assert [e.epoch for e in read_manifest(tmp_path)] == [1, 2, 3]
    assert not list(tmp_path.glob("*.tmp"))  # the new write replaced the partial one


def test_a_sharded_record_has_nothing_pickled(tmp_path: Path) -> None:
    torchrun(2, tmp_path, 1, "false", "fsdp")
    record = tmp_path / read_manifest(tmp_path)[-1].file
    for f in record.iterdir():
        head = f.read_bytes()[:2]
        assert head != b"\x80\x04" and head != b"\x80\x05", f  # pickle protocol 4/5 magic
    json.loads((record / "header.json").read_text())


def test_a_two_rank_sharded_record_reshards_onto_four_ranks(tmp_path: Path) -> None:
    torchrun(2, tmp_path, 2, "false", "fsdp")
    saved = tensors(tmp_path / "final-2-false-fsdp-w2-rank0.safetensors")
    done = torchrun(4, tmp_path, 3, "auto", "fsdp", timeout=600)
    assert "written by 2 process(es), on 4" in done.stderr
    for rank in range(4):
        assert_equal_tensors(
            tensors(tmp_path / f"loaded-3-auto-fsdp-w4-rank{rank}.safetensors"), saved
        )
    assert [e.epoch for e in read_manifest(tmp_path)] == [1, 2, 3]


def test_restore_optimizer_into_fsdp_takes_every_moment_under_the_new_learning_rate(
    tmp_path: Path,
) -> None:
    from safetensors import safe_open

    a = tmp_path / "a"
    torchrun(2, a, 2, "false", "fsdp")
    entry = read_manifest(a)[-1]
    saved, meta = store.read_record(a / entry.file)
    names = [name for group in meta["layout"]["groups"] for name in group]
    slots = sorted({k.rsplit("/", 1)[1] for k in saved if k.startswith("optim/state/")})
    assert {"exp_avg", "exp_avg_sq"} <= set(slots)
    for nproc in (2, 1):  # the same world size, and another
        b = tmp_path / f"b{nproc}"
        torchrun(nproc, b, 1, "false", "fsdp",
                 env={"NITRO_TEST_RESTORE_FROM": f"{a / entry.file}/"})  # fmt: skip
        for rank in range(nproc):
            path = b / f"restored-rank{rank}.safetensors"
            with safe_open(str(path), "pt") as f:
                assert f.metadata()["lr"] == "0.005"  # this experiment's, not the record's
            got = tensors(path)
            for i, name in enumerate(names):
                assert torch.equal(got[f"params/{name}"], saved[f"params/{name}"]), name
                for slot in slots:
                    want = saved[f"optim/state/{i}/{slot}"]
                    assert torch.equal(got[f"{name}/{slot}"], want), (nproc, rank, name, slot)
        trained = [tensors(b / f"trained-rank{rank}.safetensors") for rank in range(nproc)]
        for name in names:  # it trained on: the ranks agree, and the parameters moved
            assert all(torch.equal(t[name], trained[0][name]) for t in trained), name
            assert not torch.equal(trained[0][name], saved[f"params/{name}"]), name


def test_a_write_failing_on_rank_0_stops_every_rank_at_the_next_point(tmp_path: Path) -> None:
    # rank 0 alone commits a sharded record: its second publish fails in the background;
    # rank 1 must not go on into the next collective and wait there forever
    done = torchrun(2, tmp_path, 4, "false", "fsdp", env={"NITRO_TEST_FAIL_PUBLISH": "2"},
                    check=False, timeout=600)  # fmt: skip
    assert_both_ranks_stopped_on_rank_0s_failed_write(done, tmp_path)
