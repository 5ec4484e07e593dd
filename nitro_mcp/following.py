"""Following a job cheaply: the call to advise, the brief reply, progress inside an epoch
(as a reply field and as a progress notification), and the size bound of the full reply.

The worker writes the epoch in progress to the job's status about every two seconds
(:mod:`nitro_core.training.progress`); this module only reads it. A snapshot's ETAs are
aged by the time since it was written, so a reply never promises more time than is left.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from nitro_core.errors import ConfigError
from nitro_core.jobs import JobStatus
from nitro_mcp import models
from nitro_mcp.echo import clip
from nitro_mcp.refusals import job_error

Until = Literal["change", "end"]
FOLLOW_WAIT_S = 25  # the longest nitro_status long-poll
REPLY_MOST = 8000  # characters of a full nitro_status reply


def follow_call(job_id: str) -> str:
    """The cheapest call that follows ``job_id`` to its end."""
    return f"nitro_status(job_id='{job_id}', wait_s={FOLLOW_WAIT_S}, until='end', brief=true)"


def check_until(until: str) -> Until:
    if until not in ("change", "end"):
        raise ConfigError(
            f"until={clip(until)} is not a way to wait; write until='end' (return when the job "
            "ends or wait_s passes) or until='change' (also at each epoch's end)."
        )
    return "end" if until == "end" else "change"


def in_epoch(status: JobStatus, now: float | None = None) -> models.InEpochProgress | None:
    """The epoch in progress, when the job trains one; its ETAs aged to ``now``."""
    snap = status.progress
    if snap is None or status.state != "running" or snap.epoch < status.epoch:
        return None  # not training, or a snapshot of an epoch already reported whole
    age = max(0.0, (time.time() if now is None else now) - snap.at)

    def left(eta: float | None) -> float | None:
        return None if eta is None else round(max(0.0, eta - age), 1)

    return models.InEpochProgress(
        epoch=snap.epoch, batch=snap.batch, batches=snap.batches, loss=snap.loss,
        epoch_eta_s=left(snap.epoch_eta_s), eta_s=left(snap.eta_s), age_s=round(age, 1),
    )  # fmt: skip


def brief(status: JobStatus, nxt: str) -> models.JobStatusResult:
    """State, epoch and step, the epoch in progress, the last metrics and ``next``; the
    error too when there is one."""
    reply = models.JobStatusResult(
        job_id=status.job_id, state=status.state, epoch=status.epoch, max_epochs=status.max_epochs,
        step=status.step, progress=in_epoch(status), last_loss=status.last_loss,
        last_val=status.last_val, next=nxt,
    )  # fmt: skip
    if status.error is not None:
        reply.error = job_error(status)  # set: so the reply carries it
    return reply


def notification(status: JobStatus) -> tuple[float, float | None, str]:
    """(progress, total, message) of a progress notification: epochs done, fractional
    inside an epoch, out of max_epochs."""
    done = float(status.epoch)
    snap = in_epoch(status)
    if snap is not None and snap.batches and snap.epoch > status.epoch:
        done = snap.epoch - 1 + min(1.0, snap.batch / snap.batches)
    total = float(status.max_epochs) if status.max_epochs else None
    return done, total, message(status, snap)


def message(status: JobStatus, snap: models.InEpochProgress | None = None) -> str:
    val = ", ".join(f"{k}={v:.4g}" for k, v in status.last_val.items() if v is not None)
    text = f"{status.state}/{status.phase}: epoch {status.epoch}/{status.max_epochs or '?'} step {status.step}"
    if snap is not None:
        of = f"/{snap.batches}" if snap.batches else ""
        text += f"; epoch {snap.epoch} batch {snap.batch}{of}"
        if snap.loss is not None:
            text += f" loss {snap.loss:.4g}"
        if snap.eta_s is not None:
            text += f", ETA {_duration(snap.eta_s)}"
    return f"{text} {val}".strip()


def bounded(result: models.JobStatusResult) -> models.JobStatusResult:
    """The full reply cut to ``REPLY_MOST`` characters of JSON: the log tail first (its end
    kept, from a line start), then the oldest kept checkpoints, then the job result's lists
    (the newest items kept, each cut named), and last the error and hint texts."""
    over = _size(result) - REPLY_MOST
    if over > 0 and result.log_tail:
        tail = result.log_tail[-max(200, len(result.log_tail) - over - 64) :]
        result.log_tail = tail[tail.find("\n") + 1 :] if "\n" in tail[:-1] else tail
    while _size(result) > REPLY_MOST and result.kept and len(result.kept) > 3:
        result.kept = result.kept[len(result.kept) // 2 :]
    whole = result.result
    for keep in (8, 4, 2, 1, 0):
        if whole is None or _size(result) <= REPLY_MOST:
            break
        result.result = _cut(whole, keep)
    for name in ("error", "hint"):
        text = getattr(result, name)
        if _size(result) > REPLY_MOST and text is not None and len(text) > 1000:
            setattr(result, name, text[:997] + "...")
    return result


def _size(result: models.JobStatusResult) -> int:
    return len(result.model_dump_json(indent=2))  # as the reply's text content is written


def _cut(result: dict[str, Any], keep: int) -> dict[str, Any]:
    """The job's result with each list cut to its last ``keep`` items and long texts cut."""
    out: dict[str, Any] = {}
    for key, value in result.items():
        if isinstance(value, list) and len(value) > keep:
            out[key] = value[len(value) - keep :]
            out[f"{key}_cut"] = f"the last {keep} of {len(value)}"
        elif isinstance(value, str) and len(value) > 300:
            out[key] = value[:297] + "..."
        else:
            out[key] = value
    return out


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


__all__ = [
    "FOLLOW_WAIT_S",
    "brief",
    "bounded",
    "check_until",
    "follow_call",
    "in_epoch",
    "notification",
]
