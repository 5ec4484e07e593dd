"""Compare-and-set of a job's ``status.json`` under a per-job file lock (``.status.lock``,
never opened through a link), so the server and the worker never overwrite each other's
fields.

Every change is conditional: a state moves only from the states its writer expects, and a
terminal state (succeeded, failed, stopped, lost) is final. A fast worker's result is
therefore never overwritten by the server's late "running", and a forced stop never
overwrites a result the worker recorded a moment before the kill.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from nitro_core.jobs.files import TERMINAL, JobStatus, locked, read_status, write_json


def compare_and_set(
    directory: Path, check: Callable[[JobStatus], bool], **changes: Any
) -> JobStatus | None:
    """Apply ``changes`` when the current status passes ``check`` and is not terminal;
    the new status, or None when it was left as it was."""
    with locked(directory, ".status.lock"):  # a flock on a file never followed through a link
        status = read_status(directory)
        if status.state in TERMINAL or not check(status):
            return None
        status = status.model_copy(update=changes)
        JobStatus.model_validate(status.model_dump())  # refuse a bad field before it lands
        write_json(directory / "status.json", status)
    return status


def update_status_if(directory: Path, states: Collection[str], **changes: Any) -> JobStatus | None:
    """Apply ``changes`` only while the job is in one of ``states`` (a claim: two servers
    over one root never both launch a queued job); None when it was not."""
    return compare_and_set(directory, lambda s: s.state in states, **changes)


def update_status(directory: Path, **changes: Any) -> JobStatus:
    """Progress of a live job (phase, epoch, loss...): applied unless the job has ended;
    returns the status as it now stands. States move only through ``update_status_if``."""
    assert "state" not in changes, "a state moves only by compare-and-set"
    changed = compare_and_set(directory, lambda s: True, **changes)
    return changed if changed is not None else read_status(directory)
