"""Launching the distributed tests' training script under ``torch.distributed.run``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

SCRIPT = Path(__file__).with_name("rank_script.py")


def torchrun(
    nproc: int,
    *args: object,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    check: bool = True,
    script: Path = SCRIPT,
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` on ``nproc`` processes (gloo, CPU; ``--standalone``: a free port, so
    launches never collide); fail the test with its output when it fails (unless ``check``
    is false)."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}", str(script), *map(str, args),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "default", **(env or {})}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if check and done.returncode != 0:
        pytest.fail(f"torchrun failed ({done.returncode}):\n{done.stderr[-6000:]}")
    return done


def one_process(*args: object, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The same script in one plain process (no torchrun)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env={**env, "PYTHONWARNINGS": "default"},
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"the script failed ({done.returncode}):\n{done.stderr[-6000:]}")
    return done


def tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def assert_same_final(a: Path, a_tag: str, b: Path, b_tag: str, world: int = 2) -> None:
    """The final parameters rank_script.py wrote in ``a`` (tag ``a_tag``) and ``b`` are
    equal, bit for bit, on every rank."""
    for rank in range(world):
        assert_equal_tensors(
            tensors(a / f"final-{a_tag}-rank{rank}.safetensors"),
            tensors(b / f"final-{b_tag}-rank{rank}.safetensors"),
        )


def assert_equal_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


def assert_both_ranks_stopped_on_rank_0s_failed_write(
    done: subprocess.CompletedProcess[str], run_dir: Path
) -> None:
    """Rank 0's injected write error stopped every rank (none waited for it), in the same
    words, and the first record is still listed."""
    from nitro_core import read_manifest

    assert done.returncode != 0
    assert "OSError: [Errno 5] Input/output error (injected)" in done.stderr
    assert (
        "TrainingRefused: Rank 0's checkpoint write failed (OSError: [Errno 5] Input/output "
        "error (injected)); every rank stops here."
    ) in done.stderr
    assert [e.epoch for e in read_manifest(run_dir)] == [1]  # the first record, intact


def rank_pids(launcher: int) -> dict[int, int]:
    """``{rank: pid}`` of the rank processes torchrun ``launcher`` started."""
    found = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
                cmdline = (proc / "cmdline").read_bytes()
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == launcher and b"rank_script.py" in cmdline:
                rank = next(v for v in environ if v.startswith(b"RANK="))
                found[int(rank.removeprefix(b"RANK="))] = int(proc.name)
    return found
