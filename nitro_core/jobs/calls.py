"""A job's spec read back as the MCP tool call that made it, repeats it or continues it.

Every hint after a job ends ``lost``, ``stopped`` or ``failed`` is one of these calls, written
with the job's own arguments (experiment, run_dir, overrides, device...), so a client can send
it as it stands: ``nitro_train(experiment='Classifier', run_dir='runs/Classifier',
resume='auto', overrides={'samples': 12000})``. Paths are shown relative to the root the
server resolves them against. Pure: strings from a spec, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from nitro_core.jobs.call_models import Call, TrainCall, defaults
from nitro_core.jobs.files import JobSpec

TOOLS = {"train": "nitro_train", "validate": "nitro_validate", "average": "average"}

# what a call is about: written even at its default (``nitro_validate(..., weights='latest =>
# best')``); every other argument at its default is left out
_NAMED = frozenset({"experiment", "run_dir", "weights", "source"})


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


def shown(root: Path, path: str | Path | None) -> str | None:
    """``path`` relative to ``root`` when inside it (as tool arguments are written)."""
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


def arguments(model: type[Call], args: Mapping[str, Any]) -> dict[str, Any]:
    """A call's arguments without those at the defaults of ``model``'s fields (a name that
    is not a field of it is kept), in the order given."""
    default = defaults(model)
    return {
        k: v
        for k, v in args.items()
        if k not in default or v != default[k] or (k in _NAMED and v is not None)
    }


def train_arguments(**args: Any) -> dict[str, Any]:
    """``nitro_train`` arguments without those at their defaults, in the order given."""
    return arguments(TrainCall, args)


def train_call(spec: JobSpec, root: Path, **changes: Any) -> str:
    """The ``nitro_train`` call of a train job, with ``changes`` applied."""
    return tool_call("nitro_train", spec_arguments(spec, root, **changes))


def spec_arguments(spec: JobSpec, root: Path, **changes: Any) -> dict[str, Any]:
    """A job's call as its tool's arguments (paths shown from the root), ``changes`` applied."""
    args = spec.call.model_dump(by_alias=True)
    for path in ("run_dir", "save"):
        if args.get(path) is not None:
            args[path] = shown(root, args[path])
    return arguments(type(spec.call), {**args, **changes})


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


Failure = Literal["diverged", "corrupt", "refused", "unexpected"]


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


def nothing_to_train(args: Mapping[str, Any], run: str, epoch: int, max_epochs: int) -> str:
    """The refusal of a resume that would train nothing (the run reached ``max_epochs``);
    ``args`` are the ``nitro_train`` arguments of the call, ``resume`` among them."""
    more = epoch + max_epochs
    call = tool_call(
        "nitro_train", {**args, "overrides": {**(args.get("overrides") or {}), "max_epochs": more}}
    )
    return (
        f"resume={args.get('resume')!r} has nothing to train: run {run} reached epoch {epoch}, "
        f"and max_epochs is {max_epochs}. To train further, pass a larger max_epochs, e.g. "
        f"overrides={{'max_epochs': {more}}}: {call}."
    )
