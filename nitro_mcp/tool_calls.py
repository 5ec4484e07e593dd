"""A job's spec read back as the MCP tool call that made it, repeats it or continues it.

Every hint after a job ends ``lost``, ``stopped`` or ``failed`` is one of these calls, written
with the job's own arguments (experiment, run_dir, overrides, device...), so a client can send
it as it stands: ``nitro_train(experiment='Classifier', run_dir='runs/Classifier',
resume='auto', overrides={'samples': 12000})``. The arguments come from the core
(:mod:`nitro_core.jobs.calls`); this module only writes them as calls. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nitro_core.errors import Operation
from nitro_core.jobs.calls import shown, spec_arguments
from nitro_core.jobs.files import Failure, JobSpec

TOOLS: dict[Operation, str] = {
    "train": "nitro_train",
    "validate": "nitro_validate",
    "average": "average",
}


def tool_call(tool: str, args: Mapping[str, Any]) -> str:
    """``tool(key=value, ...)``: ``nitro_train(experiment='X', overrides={'lr': 0.1})``."""
    return f"{tool}({', '.join(f'{k}={value(v)}' for k, v in args.items())})"


def value(v: Any) -> str:
    """A tool argument as a call writes it: strings quoted, JSON's true, false and null."""
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{value(k)}: {value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    return repr(v)


def train_call(spec: JobSpec, root: Path, **changes: Any) -> str:
    """The ``nitro_train`` call of a train job, with ``changes`` applied."""
    return tool_call("nitro_train", spec_arguments(spec, root, **changes))


def resume_call(spec: JobSpec, root: Path, **changes: Any) -> str:
    """The call that continues a train job's run: its own arguments with ``resume='auto'``
    (a resume takes no weights, and restores the recorded seed)."""
    return train_call(
        spec, root, resume="auto", weights=None, restore_optimizer=False, strict=True, seed=None,
        **changes,
    )  # fmt: skip


def same_call(spec: JobSpec, root: Path) -> str:
    """The call that made the job, to send again."""
    return tool_call(TOOLS[spec.kind], spec_arguments(spec, root))


def after_end(spec: JobSpec, root: Path, state: str, run_id: str | None) -> str:
    """What to call after a job ended ``lost`` or ``stopped``: continue its run (a train job
    that got as far as a run), else send the same call again."""
    if spec.kind == "train" and run_id is not None:
        return f"The run stays resumable: {resume_call(spec, root)} continues it."
    if state == "lost":
        return f"It ended before its result was recorded; call again: {same_call(spec, root)}."
    return f"Nothing was done; to run it after all, call again: {same_call(spec, root)}."


def after_failure(spec: JobSpec, root: Path, failure: Failure, recorded_run: str | None) -> str:
    """What to call after a job failed: ``diverged`` (a non-finite loss or monitor),
    ``corrupt`` (a record did not read back), ``refused`` (a Nitro error, which says what to
    change) or ``unexpected``; ``recorded_run`` is the job's run when it wrote a record."""
    again = same_call(spec, root)
    if spec.kind == "train" and failure == "diverged":
        if recorded_run is None:
            return (
                "Lower the learning rate, or fix the data or the metric, then start again: "
                f"{again}, with the changed fields in overrides."
            )
        branch = train_call(spec, root, resume="false", weights=f"{recorded_run} => latest")
        return (
            "Lower the learning rate, or fix the data or the metric. A resume keeps the run's "
            f"recorded config, so change it in a new run from the last good record: {branch}, "
            "with the changed fields in overrides."
        )
    if failure == "corrupt":
        listing = tool_call("nitro_manifest", {"run_dir": shown(root, spec.run_dir)})
        return f"Pick another checkpoint ({listing} lists them), then call again: {again}."
    if failure == "refused":
        return f"The error says what to write instead; then call again: {again}."
    if spec.kind == "train" and recorded_run is not None:
        return (
            "An unexpected error: the log tail holds the traceback. The run stays resumable: "
            f"{resume_call(spec, root)}."
        )
    return f"An unexpected error: the log tail holds the traceback. Call again: {again}."
