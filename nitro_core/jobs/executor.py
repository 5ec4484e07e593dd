"""The executor seam (DESIGN.md section 13): what the job manager asks of whatever runs a
job, and the Slurm executor.

An executor submits a job whose files are written (``queued``), refreshes a job's status
with what only it can tell (its queue state; a worker or an allocation gone without the
worker's recorded end, which ends the job ``lost``, or ``stopped`` when a stop was asked),
and stops a job (a queued one cancelled, a running one asked or killed). The job directory
stays the truth that ``nitro_status`` reports: an executor writes to it only through
:mod:`nitro_core.jobs.status`. Two executors: :class:`~nitro_core.jobs.local.LocalExecutor`
(worker processes on this machine, from Nitro's own queue) and :class:`SlurmExecutor`
(the scheduler's queue: :mod:`nitro_core.jobs.cluster` over :mod:`nitro_core.jobs.slurm`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from nitro_core.jobs import cluster, slurm
from nitro_core.jobs.files import JobSpec, JobStatus


class Executor(Protocol):
    """What runs jobs: the job manager asks it to start, to report on and to stop a job."""

    def submit(self, directory: Path, spec: JobSpec) -> None:
        """Start the queued job in ``directory``, now or when its queue lets it."""
        ...

    def refresh(self, directory: Path, status: JobStatus) -> JobStatus:
        """``status`` brought up to date with what the executor alone knows."""
        ...

    def stop(self, directory: Path, status: JobStatus, force: bool) -> JobStatus:
        """Stop the job (not ended): gracefully, or at once with ``force``."""
        ...


class SlurmExecutor:
    """Jobs handed to Slurm (``executor="slurm"``): submitted with ``sbatch``, followed through
    the engine, stopped with ``scancel``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.engine = slurm.Engine()  # the cluster's scheduler, asked at most once a second a job

    def submit(self, directory: Path, spec: JobSpec) -> None:
        """Hand the job to Slurm, whose queue holds it (not Nitro's slots)."""
        cluster.start(directory, spec, self.root)

    def refresh(self, directory: Path, status: JobStatus) -> JobStatus:
        if status.state not in ("queued", "running"):
            return status
        return cluster.refresh(directory, status, self.engine)

    def stop(self, directory: Path, status: JobStatus, force: bool) -> JobStatus:
        return cluster.stop(directory, status, force)
