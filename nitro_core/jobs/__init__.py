"""Jobs: training, validation and averaging run in worker processes whose spec, status,
events and log live on disk under ``<root>/.nitro/jobs/<job_id>/``, so a job survives its
client's disconnect and the server's restart.

The names load lazily (PEP 562): ``nitro_core.jobs.call_models`` (the call models the CLI
parser is built from) imports no torch, and importing it runs this file."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "JobKind": "nitro_core.jobs.files",
    "JobSpec": "nitro_core.jobs.files",
    "JobState": "nitro_core.jobs.files",
    "JobStatus": "nitro_core.jobs.files",
    "JobManager": "nitro_core.jobs.manager",
}

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ loads them
    from nitro_core.jobs.files import JobKind as JobKind
    from nitro_core.jobs.files import JobSpec as JobSpec
    from nitro_core.jobs.files import JobState as JobState
    from nitro_core.jobs.files import JobStatus as JobStatus
    from nitro_core.jobs.manager import JobManager as JobManager


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'nitro_core.jobs' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


__all__ = ["JobKind", "JobManager", "JobSpec", "JobState", "JobStatus"]
