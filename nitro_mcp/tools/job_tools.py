"""The jobs family: ``nitro_status``, ``nitro_jobs`` and ``nitro_stop``.

A job's files are the truth these tools report (``nitro_core.jobs``): its state and phase,
its progress inside an epoch, the records its run kept and why, its log's tail, and for a
cluster job the scheduler's last word. ``nitro_status`` long-polls; ``nitro_jobs`` pages the
job index and removes ended jobs when asked; ``nitro_stop`` stops a job at its next point or
kills it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from mcp.server.mcpserver import Context
from pydantic import Field, StrictBool

from nitro_core.errors import ConfigError
from nitro_core.jobs import JobStatus
from nitro_core.jobs.call_models import Refusal
from nitro_core.jobs.files import TERMINAL, job_dir, log_tail
from nitro_core.jobs.groups import is_group_id
from nitro_core.policy import retention
from nitro_core.store import listing, manifest
from nitro_mcp import following, job_cleanup, models, seed_groups
from nitro_mcp.echo import clip
from nitro_mcp.gate import Gate, Progress, next_step, page
from nitro_mcp.paths import shown
from nitro_mcp.refusals import job_error
from nitro_mcp.replies import NitroServer, fit
from nitro_mcp.tools.declare import Cursor, JobsLimit, off_loop, progress_of, tool

LOG_TAIL = 3000  # characters of a job's log in nitro_status
State = Literal["queued", "running", "succeeded", "failed", "stopped", "lost"]


def register(server: NitroServer, gate: Gate) -> None:
    @tool(server, "A job's state, progress, metrics, kept checkpoints and log tail; wait_s "
          "long-polls.")  # fmt: skip
    async def nitro_status(
        job_id: Annotated[
            str, Field(description="From nitro_train (a job or group), nitro_validate, average.")
        ],
        wait_s: Annotated[
            float,
            Field(ge=0, le=25, description="Long-poll seconds."),
            Refusal("wait_s={value} is out of range; give 0 to 25 seconds."),
        ] = 0,
        until: Annotated[
            Literal["change", "end"],
            Field(description="change: also at an epoch's end; end: only at the job's end."),
            Refusal(
                "until={value} is not a way to wait; write until='end' (return when the job "
                "ends or wait_s passes) or until='change' (also at each epoch's end)."
            ),
        ] = "change",
        brief: Annotated[
            StrictBool,
            Field(description="Only state, epoch, step, progress, last metrics, error and next."),
        ] = False,
        ctx: Context | None = None,
    ) -> models.JobStatusResult:
        return await status(gate, job_id, wait_s, progress_of(ctx), until, brief)

    @tool(server, "Jobs, newest first, also from before a server restart.")  # fmt: skip
    async def nitro_jobs(
        state: Annotated[State | None, Field(description="Only jobs in this state.")] = None,
        limit: JobsLimit = 20,
        cursor: Cursor = None,
        prune_older_than_h: Annotated[float | None, Field(
            description="Remove jobs ended over this many hours ago.")] = None,
        dry_run: Annotated[StrictBool, Field(description="false: prune for real.")] = True,
    ) -> models.JobsPage:  # fmt: skip
        return await off_loop(list_jobs, gate, state, limit, cursor, prune_older_than_h, dry_run)

    @tool(server, "Stop a job at its next checkpoint; force=true kills it now. resume='auto' "
          "continues.")  # fmt: skip
    async def nitro_stop(
        job_id: Annotated[str, Field(description="The job to stop.")],
        force: Annotated[StrictBool, Field(description="Kill now, not after the epoch.")] = False,
    ) -> models.StopResult:
        return await off_loop(stop, gate, job_id, force)


async def status(
    gate: Gate, job_id: str, wait_s: float, progress: Progress | None, until: str = "change",
    brief: bool = False,
) -> models.JobStatusResult:  # fmt: skip
    by_epoch = until == "change"
    if is_group_id(job_id):  # a seed group, followed as one
        return await seed_groups.status(gate, job_id, wait_s, progress, until, brief)
    now = gate.jobs.status(checked_job_id(job_id))
    if wait_s > 0 and now.state not in TERMINAL:
        now = await gate.wait(job_id, wait_s, progress, until_change=now if by_epoch else None)
    if brief:
        return following.brief(now, next_step(now, gate.hint(now)))
    return following.bounded(_status_result(gate, now))


def list_jobs(
    gate: Gate, state: str | None, limit: int, cursor: str | None,
    prune_older_than_h: float | None = None, dry_run: bool = True,
) -> models.JobsPage:  # fmt: skip
    if state is not None and state not in get_args(State):
        raise ConfigError(
            f"state={clip(state)} is not a job state; write queued, running, succeeded, failed, stopped or lost."
        )
    start, limit = page(cursor, limit)
    pruned = None
    if prune_older_than_h is not None:  # ended jobs' directories, before the listing
        pruned = job_cleanup.prune_jobs(gate.jobs, prune_older_than_h, dry_run)
    # the job index: ended jobs from one file, only the live ones read from their own
    listed, more = gate.jobs.page(state, start, limit)  # type: ignore[arg-type]  # checked above
    jobs = seed_groups.listed(gate, listed)  # a group's jobs as one item
    shown_n = fit(jobs, limit)  # a page stays within the reply budget
    return models.JobsPage(
        jobs=jobs[:shown_n],
        next_cursor=str(start + shown_n) if more or shown_n < len(jobs) else None,
        pruned=pruned,
    )


def stop(gate: Gate, job_id: str, force: bool) -> models.StopResult:
    if is_group_id(job_id):
        return seed_groups.stop(gate, job_id, force)
    stopped = gate.jobs.stop(checked_job_id(job_id), force)
    follow = following.follow_call(job_id)
    nxt = f"The epoch finishes, validates and checkpoints first; call {follow} to see it end."
    if force:  # with the call that resumes the run, in the job's own arguments
        hint = gate.hint(stopped)
        nxt = f"Killed. {hint + ' ' if hint else ''}{follow} shows the state."
    return models.StopResult(
        job_id=stopped.job_id, state=stopped.state, phase=stopped.phase, next=nxt
    )


def checked_job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not job_id.replace("-", "").isalnum() or len(job_id) > 64:
        raise ConfigError(
            f"job_id={clip(job_id)} is not a job id; nitro_jobs lists them (e.g. job_id='20261129-072848-63c6e6')."
        )
    return job_id


def _status_result(gate: Gate, status: JobStatus) -> models.JobStatusResult:
    spec = gate.jobs.spec(status.job_id)
    hint = gate.hint(status, spec)
    kept = []
    if status.run_id:
        entries = listing.read_manifest(status.run_dir)  # a path, or an object-store URL
        why = retention.explain(entries, status.run_id)
        kept = [
            models.KeptCheckpoint(
                file=e.file,
                kept_by=list(why.get(e.file, ())),
                epoch=e.epoch,
                step=e.step,
                score=e.score,
                metric=e.metric,
                stop_reason=e.stop_reason,
            )  # fmt: skip
            for e in manifest.run_entries(entries, status.run_id)
        ][-20:]
    return models.JobStatusResult(
        job_id=status.job_id, kind=status.kind, state=status.state, phase=status.phase, experiment=spec.experiment,
        run_dir=shown(gate.root, status.run_dir), run_id=status.run_id, epoch=status.epoch,
        max_epochs=status.max_epochs, step=status.step, progress=following.in_epoch(status),
        last_loss=status.last_loss, last_val=status.last_val,
        kept=kept, error=job_error(status), hint=hint, result=status.result, elapsed_s=_elapsed(status),
        log_tail=log_tail(job_dir(gate.root, status.job_id), LOG_TAIL), next=next_step(status, hint),
        cluster=_cluster(status),
    )  # fmt: skip


def _cluster(status: JobStatus) -> dict[str, Any] | None:
    """A cluster job's Slurm id and the scheduler's last word on it."""
    if status.executor == "local":
        return None
    engine = status.engine.model_dump() if status.engine is not None else None
    return {"executor": status.executor, "slurm_id": status.slurm_id, "engine": engine}


def _elapsed(status: JobStatus) -> float | None:
    if status.started is None:
        return None
    start = datetime.fromisoformat(status.started.replace("Z", "+00:00"))
    end = (
        datetime.fromisoformat(status.ended.replace("Z", "+00:00"))
        if status.ended
        else datetime.now(start.tzinfo)
    )
    return round((end - start).total_seconds(), 2)
