"""``nitro train EXPERIMENT --nproc N``: the same command on N processes through
``torch.distributed.run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nitro_core import read_manifest
from nitro_core.store import recordio as store
from nitro_mcp.cli import main


def test_a_process_count_out_of_range_is_refused_with_an_example(capsys, tmp_path):
    assert main(["train", "Regression", "--run-dir", str(tmp_path), "--nproc", "0"]) == 2
    assert "nitro train: --nproc 0 is not 1 to 64; e.g. --nproc 2." in capsys.readouterr().err
    assert not tmp_path.joinpath("manifest.json").exists()


@pytest.mark.slow  # two ranks through torch.distributed.run
def test_nproc_two_trains_on_two_ranks_and_rank_0_alone_prints(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "nitro_mcp.cli", "train", "Regression", "--set", "max_epochs=2",
         "--run-dir", str(tmp_path / "run"), "--nproc", "2"],
        capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]  # stdout: JSON lines only
    assert [r["epoch"] for r in rows] == [1, 2]  # one line per epoch, not one per rank
    assert done.stderr.count("completed at epoch 2") == 1  # the prose, on stderr, once
    entries = read_manifest(tmp_path / "run")
    meta = store.read_header(tmp_path / "run" / entries[-1].file)
    assert meta["distributed"] == {"world": 2, "strategy": "ddp"}


def _train_call(*argv: str):
    from nitro_mcp.cli import _build
    from nitro_mcp.cli.training_commands import train_call

    args = _build()[0].parse_args(["train", *argv])
    return train_call(args)


@pytest.mark.parametrize(
    "executor",
    [[], ["--executor", "local"], ["--executor", "slurm"], ["--nproc", "2"],
     ["--executor", "slurm", "--nodes", "2", "--slurm", '{"partition": "debug"}']],
)  # fmt: skip
def test_every_executor_path_builds_one_train_call_that_carries_the_set_overrides(executor):
    """``--set`` is the call's ``overrides`` whichever executor runs it: the Slurm branch once
    submitted ``overrides: {}`` and trained the class defaults (issue 34)."""
    call = _train_call("Regression", "--set", "max_epochs=2", "--set", "samples=64", *executor)
    assert call.overrides == {"max_epochs": 2, "samples": 64}


def test_a_typo_inside_slurm_names_the_option_and_what_it_takes(capsys, tmp_path):
    argv = ["train", "Regression", "--run-dir", str(tmp_path), "--executor", "slurm",
            "--slurm", '{"partiton": "debug"}']  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "nitro train: --slurm: unknown option 'partiton'; it takes: partition, account, gres, "
        "qos, extra."
    )
