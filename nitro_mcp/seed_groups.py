"""Following a seed group as one item: ``nitro_train(seeds=[...])``'s reply, ``nitro_status``
of a group id (long-polled like a job's) and the group's one line in ``nitro_jobs``.

A group and its state are :mod:`nitro_core.jobs.groups`'; this module reads its jobs'
statuses through the gate and says what to call next: follow it while it runs, compare it
once it has ended, read a failed seed's own status.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import anyio

from nitro_core.errors import ConfigError, NitroError
from nitro_core.jobs import JobStatus
from nitro_core.jobs.files import TERMINAL
from nitro_core.jobs.groups import (
    Group,
    counts,
    ended,
    finished,
    group_state,
    member_statuses,
    read_group,
)
from nitro_core.jobs.index import IndexRow
from nitro_mcp import following, models
from nitro_mcp.gate import POLL, Gate, Progress
from nitro_mcp.paths import shown

LISTED = "nitro_jobs lists groups and jobs (a group's job_id starts with 'group-')"
LAST_VAL = 3  # metrics of each seed's last validation in a group's reply (16 seeds fit)


def read(gate: Gate, group_id: str) -> Group:
    return read_group(gate.jobs.store_dir, group_id, LISTED)


def brief(
    gate: Gate, group: Group, statuses: Sequence[JobStatus] | None = None
) -> models.GroupBrief:
    """The group's state, its jobs per state, and each seed's job in a line."""
    statuses = member_statuses(group, gate.jobs.status) if statuses is None else statuses
    return models.GroupBrief(
        group=group.group, state=group_state(statuses), n=len(statuses),
        counts=counts(statuses),
        jobs=[
            models.GroupJob(job_id=s.job_id, seed=seed, state=s.state, run_dir=shown(gate.root, s.run_dir),
                            epoch=s.epoch, last_val=dict(list(s.last_val.items())[:LAST_VAL]))
            for seed, s in zip(group.seeds, statuses, strict=True)
        ],
    )  # fmt: skip


async def status(
    gate: Gate, group_id: str, wait_s: float, progress: Progress | None, until: str, short: bool
) -> models.JobStatusResult:
    """``nitro_status`` of a group: its state once it ends (``until='end'``) or once any of its
    jobs ends an epoch or changes state (``'change'``), at most ``wait_s`` seconds."""
    group = await anyio.to_thread.run_sync(read, gate, group_id)
    statuses = member_statuses(group, gate.jobs.status)
    deadline = time.monotonic() + wait_s
    seen = _seen(statuses)
    while not ended(statuses) and time.monotonic() < deadline:
        await anyio.sleep(POLL)
        statuses = member_statuses(group, gate.jobs.status)
        if _seen(statuses) != seen:
            seen = _seen(statuses)
            if progress is not None:
                done, total = _progress(statuses)
                await progress(done, total, _message(group, statuses))
            if until == "change":
                break
    summary = brief(gate, group, statuses)
    epochs = [s.epoch for s in statuses]
    reply = models.JobStatusResult(
        job_id=group.group, state=summary.state, epoch=min(epochs), max_epochs=statuses[0].max_epochs,
        step=min(s.step for s in statuses), last_loss=None, last_val={}, next=_next(group, statuses),
        group=summary,
    )  # fmt: skip
    if not short:  # the full reply also says what and where
        reply.kind, reply.experiment = "train", group.experiment
        reply.run_dir = shown(gate.root, group.run_dir)
    return reply


def listed(gate: Gate, rows: Sequence[IndexRow]) -> list[models.JobSummary]:
    """A page of ``nitro_jobs``: each job in a line, each seed group in one line (the
    listing collapsed it to one row), with its jobs per state."""
    out: list[models.JobSummary] = []
    for row in rows:
        summary = models.JobSummary(
            job_id=row.job_id, kind=row.kind, state=row.state, experiment=row.experiment,
            run_dir=shown(gate.root, row.run_dir), epoch=row.epoch, created=row.created,
            group=row.group,
        )  # fmt: skip
        if row.group is not None:
            try:
                group = read(gate, row.group)
                summary.counts = counts(member_statuses(group, gate.jobs.status))
            except NitroError:  # its file is gone or not one Nitro wrote: the row as indexed
                pass
        out.append(summary)
    return out


def stop(gate: Gate, group_id: str, force: bool) -> models.StopResult:
    """Stop each of the group's jobs that is still queued or running (``force``: kill), the
    queued ones first (a running one's end would start them)."""
    group = read(gate, group_id)
    statuses = member_statuses(group, gate.jobs.status)
    live = [s for s in statuses if s.state not in TERMINAL and _of_group(gate, s, group_id)]
    if not live:
        raise ConfigError(
            f"Group {group_id} already ended; there is nothing to stop. "
            f"nitro_status(job_id={group_id!r}) shows how each seed ended."
        )
    for status in sorted(live, key=lambda s: s.state != "queued"):
        try:
            gate.jobs.stop(status.job_id, force)
        except ConfigError:  # it ended meanwhile
            pass
    statuses = member_statuses(group, gate.jobs.status)
    how = "Killed" if force else "Asked to stop at their next checkpoint"
    seeds = dict(zip(group.jobs, group.seeds, strict=True))
    resume = ", ".join(
        f"seed {seeds[s.job_id]}: run_dir={shown(gate.root, s.run_dir)!r}" for s in live
    )
    return models.StopResult(
        job_id=group_id, state=group_state(statuses), phase=None,
        next=f"{how}: {', '.join(s.job_id for s in live)}. Each seed's run continues with "
        f"nitro_train(..., run_dir=<its directory>, seed=<its seed>, resume='auto') ({resume}); "
        f"{following.follow_call(group_id)} shows them end.",
    )  # fmt: skip


def _of_group(gate: Gate, status: JobStatus, group_id: str) -> bool:
    """Whether the job's own spec names the group (a group file names no other job)."""
    try:
        return gate.jobs.spec(status.job_id).group == group_id
    except NitroError:
        return False


def _seen(statuses: Sequence[JobStatus]) -> tuple[object, ...]:
    return tuple((s.state, s.epoch) for s in statuses)


def _progress(statuses: Sequence[JobStatus]) -> tuple[float, float | None]:
    done = float(sum(s.epoch for s in statuses))
    totals = [s.max_epochs for s in statuses]
    return done, float(sum(totals)) if all(totals) else None  # type: ignore[arg-type]


def _message(group: Group, statuses: Sequence[JobStatus]) -> str:
    parts = ", ".join(
        f"seed {seed}: {s.state} epoch {s.epoch}"
        for seed, s in zip(group.seeds, statuses, strict=True)
    )
    return f"{group.group}: {parts}"


def _next(group: Group, statuses: Sequence[JobStatus]) -> str:
    if not ended(statuses):
        return f"Call {following.follow_call(group.group)}: it returns when every seed's job has ended."
    short = [f"{s.job_id} ({s.state})" for s in statuses if not finished(s)]
    compare = (
        f"nitro_compare(group={group.group!r}) gives each metric's mean and standard deviation; "
        f"add baseline='<group id or run_dir>' for the difference in units of its spread."
    )
    if not short:
        return f"Done. {compare}"
    return (
        f"{len(short)} of {len(statuses)} seeds did not succeed: {', '.join(short)}; "
        f"nitro_status(job_id=...) of each says why. {compare} (the others only)"
    )


__all__ = ["LISTED", "brief", "listed", "read", "status", "stop"]
