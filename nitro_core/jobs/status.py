"""Read-modify-write of a job's ``status.json`` under a per-job file lock, so the server
and the worker never overwrite each other's fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from filelock import FileLock

from nitro_core.jobs.files import JobStatus, read_status, write_json


def update_status(directory: Path, **changes: Any) -> JobStatus:
    with FileLock(directory / ".status.lock"):
        status = read_status(directory).model_copy(update=changes)
        JobStatus.model_validate(status.model_dump())  # refuse a bad field before it lands
        write_json(directory / "status.json", status)
    return status
