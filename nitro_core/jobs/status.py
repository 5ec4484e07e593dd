"""Read-modify-write of a job's ``status.json`` under a per-job file lock, so the server
and the worker never overwrite each other's fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from filelock import FileLock

from nitro_core.jobs.files import JobStatus, read_status, write_json


def update_status_if(directory: Path, states: set[str], **changes: Any) -> JobStatus | None:
    """Apply ``changes`` only while the job is in one of ``states`` (a claim: two servers
    over one root never both launch a queued job); None when it was not."""
    with FileLock(directory / ".status.lock"):
        status = read_status(directory)
        if status.state not in states:
            return None
        status = status.model_copy(update=changes)
        JobStatus.model_validate(status.model_dump())
        write_json(directory / "status.json", status)
    return status


def update_status(directory: Path, **changes: Any) -> JobStatus:
    with FileLock(directory / ".status.lock"):
        status = read_status(directory).model_copy(update=changes)
        JobStatus.model_validate(status.model_dump())  # refuse a bad field before it lands
        write_json(directory / "status.json", status)
    return status
