"""Removing ended jobs from the job store: what ``nitro_jobs(prune_older_than_h=)`` does. A dry
run unless the call says ``dry_run=false``; only ended jobs whose worker is gone are removed
(:meth:`nitro_core.jobs.JobManager.prune`)."""

from __future__ import annotations

from nitro_core.errors import ConfigError
from nitro_core.jobs import JobManager
from nitro_mcp import models
from nitro_mcp.delete_call import human_bytes
from nitro_mcp.echo import clip


def prune_jobs(jobs: JobManager, hours: float, dry_run: bool) -> models.PrunedJobs:
    """The ended jobs older than ``hours``, their directories removed unless ``dry_run``."""
    if isinstance(hours, bool) or not isinstance(hours, int | float) or not 0 <= hours < 1e6:
        raise ConfigError(
            f"prune_older_than_h={clip(hours)} is out of range; give the hours since a job "
            "ended, 0 or more, e.g. prune_older_than_h=24."
        )
    gone = jobs.prune(hours * 3600, dry_run)
    size = sum(b for _, b in gone)
    args = f"prune_older_than_h={hours:g}"
    nxt = (
        f"Dry run: nothing was removed. nitro_jobs({args}, dry_run=false) removes these "
        f"{len(gone)} job directories ({human_bytes(size)})."
        if dry_run
        else f"Removed {len(gone)} job directories ({human_bytes(size)})."
    )
    return models.PrunedJobs(
        dry_run=dry_run, jobs=[j for j, _ in gone][:50], count=len(gone), bytes=size, next=nxt
    )


__all__ = ["prune_jobs"]
