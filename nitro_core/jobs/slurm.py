"""The Slurm executor: a job submitted with ``sbatch``, its queue state read from ``sacct``
(falling back to ``squeue``, then ``scontrol``, when the cluster keeps no accounting: the
lesson of torchx#1070), cancelled with ``scancel``.

The job directory (on a filesystem every node sees) stays the truth: the batch script runs
the same worker as the local executor, which moves the job from ``queued`` to ``running``
when it starts on its node and records its end as today. The engine is asked only what the
files cannot say: whether the job still waits or runs, and whether its allocation is gone
without the worker's end (then the job is ``lost``). Each job's engine state is asked at
most once per :data:`QUERY_S` seconds by one manager; the answer names its source.

Slurm states: PENDING -> queued, RUNNING -> running, COMPLETED -> succeeded, CANCELLED ->
stopped, FAILED / NODE_FAIL / OUT_OF_MEMORY / BOOT_FAIL -> failed, TIMEOUT -> stopped with
the budget record (or lost without one). The worker's own record of the end, when there is
one, wins over any of these.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from nitro_core.errors import ConfigError
from nitro_core.jobs.call_models import SlurmOptions, TrainCall
from nitro_core.jobs.files import checked
from nitro_core.store.atomic import Replace

QUERY_S = 1.0  # the least time between two engine queries of one job
TIMEOUT_MARGIN_S = 120.0  # Slurm's --time lies this far (and 10 %) above a call's time_limit
Source = Literal["sacct", "squeue", "scontrol"]
ENDED = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
     "TIMEOUT", "PREEMPTED", "DEADLINE", "REVOKED"}
)  # fmt: skip
WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED"})


@dataclass(frozen=True)
class EngineState:
    """What Slurm says of one job: its state (``None``: it knows the job no more), which
    command answered, and when."""

    state: str | None
    source: Source
    at: float
    nodes: str | None = None


def _run(argv: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


# -- checks before submitting ---------------------------------------------------------------------
def check_submittable(call: TrainCall) -> None:
    """Refuse, before anything is submitted, a call the cluster cannot take: no ``sbatch``,
    an unknown partition, more nodes than the partition has (the options' own patterns and
    allow-list are :class:`SlurmOptions`' checks)."""
    options = call.slurm or SlurmOptions()  # its values checked by their patterns
    if shutil.which("sbatch") is None:
        raise ConfigError(
            "executor='slurm' needs Slurm's sbatch on the server's PATH, and there is none. "
            "Send executor='local', or start the server where sbatch runs (a login node); to "
            "try on one machine: python -m nitro_core.jobs.slurm_local up."
        )
    partitions = _partitions()
    if not partitions:
        raise ConfigError(
            "executor='slurm': sinfo lists no partition (is slurmctld reachable? SLURM_CONF "
            "names the cluster's slurm.conf). Send executor='local', or fix the cluster first."
        )
    name = options.partition or next((p for p, (_, d) in partitions.items() if d), None)
    if name is None:
        name = next(iter(partitions))
    if name not in partitions:
        raise ConfigError(
            f"slurm partition {name!r} is not one of this cluster's: "
            f"{', '.join(sorted(partitions))}. Send slurm={{'partition': "
            f"{sorted(partitions)[0]!r}}} (sinfo lists them)."
        )
    nodes = partitions[name][0]
    if call.nodes > nodes:
        raise ConfigError(
            f"nodes={call.nodes} is more nodes than partition {name!r} has ({nodes}). Send "
            f"nodes from 1 to {nodes}, e.g. nodes={nodes}."
        )


def _partitions() -> dict[str, tuple[int, bool]]:
    """Each partition's node count and whether it is the default, from sinfo."""
    try:
        done = _run(["sinfo", "-h", "-o", "%P %D"])
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out: dict[str, tuple[int, bool]] = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        name, count = line.split()
        default = name.endswith("*")
        name = name.rstrip("*")
        before = out.get(name, (0, False))
        out[name] = (before[0] + int(count), before[1] or default)
    return out


# -- submitting -----------------------------------------------------------------------------------
# The batch script is this constant text: every option reaches sbatch as one argv element
# (:func:`sbatch_argv`), and the worker's command line as the script's arguments, so nothing
# a caller sent is ever read by a shell (DESIGN section 16).
SCRIPT = """#!/bin/bash
# Nitro's batch script: the job's options are sbatch's arguments, and the command it runs
# arrives as this script's own ("$@"); no caller text is written here.
export PYTHONUNBUFFERED=1
exec "$@"
"""


def sbatch_argv(call: TrainCall, directory: Path, root: Path, job_name: str) -> list[str]:
    """The ``sbatch`` options of a job, one argv element each: Nitro's own (name, nodes, log,
    working directory, the TERM a minute before the end, ``--time`` above the budget), then
    the call's checked :class:`SlurmOptions`."""
    options = call.slurm or SlurmOptions()
    argv = [
        f"--job-name={job_name}",
        f"--nodes={call.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={call.nproc}",
        f"--output={directory / 'log.txt'}",
        "--open-mode=append",
        f"--chdir={root}",
        "--signal=B:TERM@60",
    ]
    if call.time_limit is not None:
        minutes = math.ceil((call.time_limit * 1.1 + TIMEOUT_MARGIN_S) / 60)
        argv.append(f"--time={minutes}")
    for name in ("partition", "account", "gres", "qos"):
        value = getattr(options, name)
        if value is not None:
            argv.append(f"--{name}={value}")
    return argv + list(options.extra)


def worker_argv(directory: Path) -> list[str]:
    """What the batch script runs: the worker of the job in ``directory``."""
    return [sys.executable, "-P", "-m", "nitro_core.jobs.worker", str(directory)]


def submit(call: TrainCall, directory: Path, root: Path, job_name: str) -> str:
    """Write the job's (constant) batch script and submit it with the job's options as
    sbatch's arguments; returns Slurm's job id."""
    path = checked(directory) / "job.sbatch"
    argv = ["sbatch", "--parsable", *sbatch_argv(call, directory, root, job_name), str(path)]
    argv += worker_argv(directory)
    Replace(path).commit(lambda f: f.write(SCRIPT.encode()))
    # the command as submitted, for a person reading the job's directory (never run from here)
    body = json.dumps(argv, indent=1).encode()
    Replace(directory / "sbatch.json").commit(lambda f: f.write(body))
    done = _run(argv, timeout=60)
    if done.returncode != 0:
        raise ConfigError(
            f"sbatch refused the job: {done.stderr.strip() or done.stdout.strip()}. Check the "
            "slurm options (partition, account, gres, qos) against sinfo and sacctmgr, then "
            "call again."
        )
    return done.stdout.strip().split(";", 1)[0]


def cancel(slurm_id: str, force: bool) -> None:
    """``scancel``: a pending job is removed; ``force`` kills a running one's every process
    (``--signal=KILL``, batch shell and steps alike)."""
    argv = ["scancel", "--full", "--signal=KILL", slurm_id] if force else ["scancel", slurm_id]
    _run(argv)


def cancel_pending(slurm_id: str) -> None:
    """Remove a job only while it still waits (a graceful stop of a queued job)."""
    _run(["scancel", "--state=PENDING", slurm_id])


# -- asking the engine ----------------------------------------------------------------------------
SACCT = ["sacct", "-n", "-P", "-X", "-o", "State,NodeList", "-j"]
SQUEUE = ["squeue", "-h", "-o", "%T|%N", "-j"]
SCONTROL = ["scontrol", "-o", "show", "job"]


def parse_sacct(out: str) -> tuple[str, str | None] | None:
    """The state and node list in ``sacct -n -P -X -o State,NodeList`` output (``None``: no
    row, as when the cluster keeps no accounting). A cancelled job's state reads
    ``CANCELLED by 0``: the first word is the state."""
    rows = [line for line in out.splitlines() if line.strip()]
    if not rows:
        return None
    state, _, nodes = rows[0].partition("|")
    return state.split()[0], (nodes.strip() or None)


def parse_squeue(out: str) -> tuple[str, str | None] | None:
    """The state and node list in ``squeue -h -o %T|%N`` output (``None``: no row)."""
    rows = [line for line in out.splitlines() if line.strip()]
    if not rows:
        return None
    state, _, nodes = rows[0].partition("|")
    return state.strip(), (nodes.strip() or None)


def parse_scontrol(out: str) -> tuple[str, str | None] | None:
    """The state and node list in ``scontrol -o show job`` output (``None``: no job)."""
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    if "JobState" not in fields:
        return None
    nodes = fields.get("NodeList")
    return fields["JobState"], (None if nodes in (None, "(null)") else nodes)


def query(slurm_id: str) -> EngineState:
    """The job's state: from sacct; when the cluster keeps no accounting (or sacct does not
    know the job yet), from squeue, then from scontrol (which remembers an ended job for
    ``MinJobAge``). ``None`` when the controller answers that it knows no such job;
    ``UNREACHABLE`` (not an end) when no command got an answer from it."""
    now = time.time()
    sources: tuple[tuple[Source, list[str], Callable[[str], tuple[str, str | None] | None]], ...]
    sources = (("sacct", SACCT, parse_sacct), ("squeue", SQUEUE, parse_squeue),
               ("scontrol", SCONTROL, parse_scontrol))  # fmt: skip
    unknown = False  # the controller said it knows no such job
    for source, argv, parse in sources:
        try:
            done = _run([*argv, slurm_id])
        except (OSError, subprocess.TimeoutExpired):
            continue  # this command is missing or hangs: ask the next
        said = parse(done.stdout) if done.returncode == 0 else None
        if said is not None:
            return EngineState(said[0], source, now, said[1])
        if source != "sacct":  # sacct fails on a cluster without accounting: no word on the job
            unknown = unknown or done.returncode == 0 or "Invalid job id" in done.stderr
    return EngineState(None if unknown else "UNREACHABLE", "scontrol", now)


class Engine:
    """The engine states one manager asked, so each job is asked at most once per
    :data:`QUERY_S` seconds: a state younger than that is answered from memory."""

    def __init__(
        self,
        ask: Callable[[str], EngineState] = query,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._ask = ask
        self._clock = clock
        self._last: dict[str, EngineState] = {}
        self.queries = 0  # how many times the engine was asked (the benchmark counts them)

    def state(self, slurm_id: str) -> EngineState:
        last = self._last.get(slurm_id)
        if last is not None and self._clock() - last.at < QUERY_S:
            return last
        self.queries += 1
        answer = self._ask(slurm_id)
        self._last[slurm_id] = answer = replace(answer, at=self._clock())
        return answer


def gone(state: EngineState) -> bool:
    """Whether the job's allocation is over (ended, or unknown to every source)."""
    return state.state is None or state.state.split()[0] in ENDED


def node_addr(node: str) -> str:
    """A node's address as slurm.conf gives it (NodeAddr), for the rendezvous endpoint."""
    done = _run(["scontrol", "-o", "show", "node", node])
    fields = dict(f.split("=", 1) for f in done.stdout.split() if "=" in f)
    return fields.get("NodeAddr", node)


def first_node(nodelist: str) -> str:
    done = _run(["scontrol", "show", "hostnames", nodelist])
    return done.stdout.split()[0]
