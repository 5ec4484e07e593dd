"""DDP through torchrun (gloo on CPU, 2 processes): exact resume, per-rank state in one
record, stops agreed across ranks, and a resume on another number of processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nitro_core import read_manifest
from nitro_core.state import ranks
from nitro_core.store import recordio as store
from tests.nitro_core.distributed.conftest import (
    assert_both_ranks_stopped_on_rank_0s_failed_write,
    assert_equal_tensors,
    assert_same_final,
    one_process,
    tensors,
    torchrun,
)

pytestmark = pytest.mark.slow


def test_ddp_two_ranks_stopped_after_two_epochs_and_resumed_end_bitwise_equal(
    tmp_path: Path,
) -> None:
    a, bc = tmp_path / "a", tmp_path / "bc"
    torchrun(2, a, 4, "false", "auto")
    torchrun(2, bc, 2, "false", "auto")
    torchrun(2, bc, 4, "auto", "auto")
    assert_same_final(a, "4-false-auto-w2", bc, "4-auto-auto-w2")
    # one record per point, written by rank 0, holding rank 1's generators too
    entries = read_manifest(bc)
    assert [e.epoch for e in entries] == [1, 2, 3, 4]
    meta = store.read_header(bc / entries[-1].file)
    assert meta["distributed"] == {"world": 2, "strategy": "ddp"}
    assert ranks.recorded_world(meta) == 2
    assert len(meta["ranks"]["states"]) == 1
    # rank 0 logs for the run: one row per point, not one per rank
    rows = [json.loads(line) for f in (bc / "logs").glob("*.jsonl") for line in f.open()]
    assert sorted(r["epoch"] for r in rows) == [1, 2, 3, 4]


def test_ddp_mid_epoch_resume_after_a_stop_ends_bitwise_equal(tmp_path: Path) -> None:
    # 390 train rows, 2 ranks, batch 32: 7 batches a rank an epoch; a point every 3 steps
    a, bc = tmp_path / "a", tmp_path / "bc"
    torchrun(2, a, 2, "false", "auto", 3)
    torchrun(
        2, bc, 2, "false", "auto", 3, 1
    )  # asked at its first point: stops at the next, epoch 1 batch 6
    entries = read_manifest(bc)
    assert (entries[-1].epoch, entries[-1].batch) == (1, 6)
    meta = store.read_header(bc / entries[-1].file)
    assert meta["ranks"]["states"][0]["data"] is not None  # rank 1's TensorBatches position
    torchrun(2, bc, 2, "auto", "auto", 3)
    for rank in (0, 1):
        assert_equal_tensors(
            tensors(a / f"final-2-false-auto-w2-rank{rank}.safetensors"),
            tensors(bc / f"final-2-auto-auto-w2-rank{rank}.safetensors"),
        )


def test_a_ddp_record_resumes_in_one_process_with_a_warning_saying_why_not_bitwise(
    tmp_path: Path,
) -> None:
    torchrun(2, tmp_path, 2, "false", "auto")
    done = one_process(tmp_path, 3, "auto", "auto")
    assert "written by 2 process(es), on 1" in done.stderr
    assert "Launch with torchrun --nproc_per_node 2 for an exact resume" in done.stderr
    # it loaded exactly what rank 0 wrote, then trained on
    saved = tensors(tmp_path / "final-2-false-auto-w2-rank0.safetensors")
    assert_equal_tensors(tensors(tmp_path / "loaded-3-auto-auto-w1-rank0.safetensors"), saved)
    assert [e.epoch for e in read_manifest(tmp_path)] == [1, 2, 3]


def test_the_example_script_trains_and_resumes_under_torchrun(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    script = Path(__file__).parents[3] / "examples/several_processes.py"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(script), "--run-dir", str(tmp_path), "--epochs", "2",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.count("rank 0 of 2 (ddp): epoch 2") == 1  # rank 0 alone prints
    again = subprocess.run(
        [*command[:-1], "3"], capture_output=True, text=True, timeout=600, env=env
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert [e.epoch for e in read_manifest(tmp_path)] == [1, 2, 3]


def test_a_one_process_record_resumes_on_two_ranks_with_the_warning(tmp_path: Path) -> None:
    one_process(tmp_path, 2, "false", "auto")
    saved = tensors(tmp_path / "final-2-false-auto-w1-rank0.safetensors")
    done = torchrun(2, tmp_path, 3, "auto", "auto")
    assert "written by 1 process(es), on 2" in done.stderr
    for rank in (0, 1):  # both ranks start from the recorded parameters
        assert_equal_tensors(
            tensors(tmp_path / f"loaded-3-auto-auto-w2-rank{rank}.safetensors"), saved
        )
    assert [e.epoch for e in read_manifest(tmp_path)] == [1, 2, 3]


def test_a_loss_non_finite_on_one_rank_only_stops_every_rank_at_the_same_point(
    tmp_path: Path,
) -> None:
    # 260 rows a rank, batches of 32: 9 batches an epoch; a point after every 3 steps. Rank
    # 1's third loss is NaN: rank 0's losses up to the point are finite (the poisoned update
    # reaches its parameters through the gradient all-reduce only after its third loss).
    run = tmp_path / "run"
    done = torchrun(2, run, 2, "false", "ddp", 3, env={"NITRO_TEST_NAN_AT": "1:3"},
                    check=False, timeout=600)  # fmt: skip
    assert done.returncode != 0
    said = "The training loss became non-finite at epoch 1, step 3 (batch 3 of the epoch on rank 1)"
    assert done.stderr.count(said) == 2, done.stderr[-4000:]  # both ranks, the same words
    assert read_manifest(run) == []  # nothing written from the poisoned update
    assert not list(run.glob("*.safetensors"))


def test_a_background_write_failing_on_rank_0_stops_every_rank_at_the_next_point(
    tmp_path: Path,
) -> None:
    done = torchrun(2, tmp_path, 4, "false", "ddp", env={"NITRO_TEST_FAIL_WRITE": "2"},
                    check=False, timeout=600)  # fmt: skip
    assert_both_ranks_stopped_on_rank_0s_failed_write(done, tmp_path)
