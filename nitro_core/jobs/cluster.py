"""Jobs on a cluster (``executor="slurm"``): what the job manager does for them instead of
starting, watching and signalling a local worker process.

Submitting writes the batch script and hands it to ``sbatch``; the job stays ``queued``
(the scheduler's queue, not Nitro's slots) until its worker starts on a node and claims it.
Refreshing asks the engine (at most once a second per job, :class:`slurm.Engine`) and
records its answer in the status (``engine``: state, source, when); when the allocation is
gone and the worker recorded no end, the job ends here: ``stopped`` when a stop was asked,
``stopped`` with the budget record when Slurm's time limit hit after the run's own budget
stop was written, else ``lost``, naming the run's last committed record and the call that
resumes it. Stopping: a pending job is removed (``scancel``); a running one gets the
``stop_requested`` flag its worker watches (graceful), or ``scancel --signal=KILL`` (forced).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nitro_core.errors import ConfigError
from nitro_core.jobs import slurm
from nitro_core.jobs.call_models import TrainCall
from nitro_core.jobs.files import EngineReport, JobSpec, JobStatus, note_event, read_status
from nitro_core.jobs.status import compare_and_set, update_status_if
from nitro_core.store.listing import read_manifest
from nitro_core.store.manifest import now_iso


def start(directory: Path, spec: JobSpec, root: Path) -> None:
    """Submit the job to Slurm; a refusal by sbatch fails the job with sbatch's words."""
    assert isinstance(spec.call, TrainCall)
    try:
        slurm_id = slurm.submit(spec.call, directory, root, f"nitro-{spec.job_id}")
    except (ConfigError, OSError) as exc:
        update_status_if(
            directory, {"queued"}, state="failed", phase="failed", ended=now_iso(), error=str(exc)
        )
        note_event(directory, {"time": now_iso(), "event": "failed"})
        return
    compare_and_set(directory, lambda s: True, slurm_id=slurm_id)
    note_event(directory, {"time": now_iso(), "event": "submitted", "slurm_id": slurm_id})


def refresh(directory: Path, status: JobStatus, engine: slurm.Engine) -> JobStatus:
    """The job's status with the engine's word on it; an allocation gone without the
    worker's end ends the job (stopped or lost)."""
    if status.slurm_id is None:
        return status
    said = engine.state(status.slurm_id)
    report = EngineReport(state=said.state, source=said.source, at=said.at, nodes=said.nodes)
    if not slurm.gone(said):
        if status.engine is None or (status.engine.state, status.engine.source) != (
            report.state,
            report.source,
        ):
            changed = compare_and_set(directory, lambda s: True, engine=report)
            return changed if changed is not None else read_status(directory)
        return status
    ended = read_status(directory)  # the worker may have recorded its end meanwhile
    if ended.state not in ("queued", "running"):
        return ended
    word = said.state.split()[0] if said.state else "unknown to the scheduler"
    changes, event = ending(word, said.source, status.slurm_id, status.stop_requested,
                            _last_record(status))  # fmt: skip

    def running(s: JobStatus) -> bool:
        return s.state in ("queued", "running")

    if "result" in changes:  # the run it continues, for resume="auto" and nitro_status
        changes["result"] = {"run_id": status.run_id, **changes["result"]}
    done = compare_and_set(directory, running, ended=now_iso(), engine=report, **changes)
    if done is None:
        return read_status(directory)
    note_event(directory, {"time": now_iso(), "event": event, "slurm_state": word})
    return done


def ending(
    word: str,
    source: str,
    slurm_id: str,
    stop_requested: bool,
    last: tuple[str, str | None] | None,
) -> tuple[dict[str, Any], str]:
    """How a job whose allocation is gone (Slurm says ``word``, from ``source``) ends when
    its worker recorded no end: the status changes and the event. A stop that was asked ->
    ``stopped``; Slurm's TIMEOUT after the run's own budget record (``last``: its file and
    stop reason) -> ``stopped`` with ``stop_reason="budget"``; anything else (cancelled from
    outside, a node failed, the time ran out before a budget record) -> ``lost``, naming the
    last committed record."""
    if stop_requested:
        return {"state": "stopped", "phase": "cancelled"}, "stopped"
    if word == "TIMEOUT" and last is not None and last[1] == "budget":
        result = {"stop_reason": "budget", "record": last[0]}
        return {"state": "stopped", "phase": "done", "result": result}, "stopped"
    named = f"its last committed record is {last[0]!r}" if last else "it committed no record"
    why = "its time limit ran out" if word == "TIMEOUT" else (
        "cancelled from outside, a node failed, or its time ran out")  # fmt: skip
    return {
        "state": "lost", "phase": "lost",
        "error": f"Slurm job {slurm_id} ended ({word}, from {source}) without the worker "
        f"recording a result: the allocation is gone ({why}); {named}.",
    }, "lost"  # fmt: skip


def stop(directory: Path, status: JobStatus, force: bool) -> JobStatus:
    """Stop a cluster job: a pending one is removed, a running one asked (or killed)."""
    if status.slurm_id is None:  # not submitted yet: it never starts
        done = update_status_if(
            directory, {"queued"}, state="stopped", phase="cancelled", ended=now_iso()
        )
        return done if done is not None else read_status(directory)
    flagged = update_status_if(directory, {"queued", "running"}, stop_requested=True)
    if flagged is None:
        return read_status(directory)
    if flagged.state == "queued":
        slurm.cancel_pending(status.slurm_id)  # a job that started meanwhile reads the flag
    if force:
        slurm.cancel(status.slurm_id, force=True)
        note_event(directory, {"time": now_iso(), "event": "kill"})
        killed = update_status_if(
            directory, {"queued", "running"}, state="stopped", phase="killed", ended=now_iso()
        )
        return killed if killed is not None else read_status(directory)
    note_event(directory, {"time": now_iso(), "event": "stop_requested"})
    return read_status(directory)


def _last_record(status: JobStatus) -> tuple[str, str | None] | None:
    """The file and stop reason of the job's run's last committed record, if any."""
    try:
        entries = read_manifest(status.run_dir)  # a path, or an object-store URL
    except Exception:  # an unreadable manifest names no record; the job is lost either way
        return None
    mine = [e for e in entries if status.run_id is None or e.run == status.run_id]
    return (mine[-1].file, mine[-1].stop_reason) if mine else None
