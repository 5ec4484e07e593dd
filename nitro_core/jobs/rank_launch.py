"""A train job on several processes (``nitro_train(..., nproc=N)``).

The job's worker launches ``torch.distributed.run --standalone --nproc_per_node N -m
nitro_core.jobs.worker --rank <job_dir>`` and waits for it; its pid stays the job's (so lost
detection and a forced stop, which kills the worker's process group, cover every rank).
Each rank builds the experiment and the handle, which joins the group. Rank 0 reports
(status, events, progress, the result and the job's end) exactly as a one-process worker
does; the other ranks train and write nothing to the job's files. A graceful stop is the
``stop_requested`` flag in ``status.json``, which every rank watches; the handle agrees on
it across the ranks at the next checkpoint point, so every rank stops at the same one.
When the launcher ends before rank 0 recorded an end (a rank crashed or was killed), the
worker records the job as failed, pointing at ``log.txt``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from nitro_core.jobs import slurm
from nitro_core.jobs.files import JobSpec, read_status
from nitro_core.jobs.status import update_status

POLL_S = 0.25


def process_limit(device: str) -> tuple[int, str]:
    """The most processes a launch may start for ``device`` on this machine, and what sets it:
    one per visible GPU when the ranks train on CUDA, else the CPUs this process may run on."""
    import torch  # lazy: `nitro --help` and the job files need no torch

    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        gpus = torch.cuda.device_count()
        return gpus, f"{gpus} visible GPU{'' if gpus == 1 else 's'} (one process per GPU)"
    affinity = getattr(os, "sched_getaffinity", None)
    cpus = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return cpus, f"{cpus} CPU{'' if cpus == 1 else 's'} this process may use, and no GPU"


def command(spec: JobSpec, directory: Path) -> list[str]:
    """The launcher's command line (``-P``: the job's cwd is not on ``sys.path``): on a
    cluster allocation of several nodes, one ``torch.distributed.run`` per node through
    ``srun``, meeting at the first node (c10d rendezvous)."""
    nodes = getattr(spec.call, "nodes", 1)
    if nodes > 1:
        host = slurm.node_addr(slurm.first_node(os.environ["SLURM_JOB_NODELIST"]))
        return [
            "srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            sys.executable, "-P", "-m", "torch.distributed.run", f"--nnodes={nodes}",
            f"--nproc-per-node={spec.nproc}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={host}:{_free_port()}", f"--rdzv-id={spec.job_id}",
            "-m", "nitro_core.jobs.worker", "--rank", str(directory),
        ]  # fmt: skip
    return [
        sys.executable, "-P", "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={spec.nproc}", "-m", "nitro_core.jobs.worker", "--rank", str(directory),
    ]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def launch(spec: JobSpec, directory: Path) -> None:
    """Run the ranks to their end (the worker's part); raise when none recorded the end."""
    update_status(directory, phase="launching")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    child = subprocess.Popen(command(spec, directory), stdin=subprocess.DEVNULL, env=env)
    while (code := child.poll()) is None:
        time.sleep(POLL_S)
    if read_status(directory).state == "running":
        raise RuntimeError(
            f"torch.distributed.run ended with exit code {code} before rank 0 recorded the "
            f"job's end: a rank failed or was killed. Each rank's traceback is in "
            f"{str(directory / 'log.txt')!r}; the run stays resumable with resume='auto'."
        )
