"""A job's call as its arguments: the fields that differ from the call model's defaults, in
the order given, paths shown relative to the root the server resolves them against.

Pure and structural (values from a spec, no I/O, no tool names): the MCP layer writes these
arguments as a tool call (``nitro_mcp.tool_calls``), a refusal carries them as a
:class:`~nitro_core.errors.Call` part.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nitro_core.errors import Call, ConfigError, arg
from nitro_core.jobs.call_models import Call as CallModel
from nitro_core.jobs.call_models import TrainCall, defaults
from nitro_core.jobs.files import JobSpec

# what a call is about: written even at its default (``nitro_validate(..., weights='latest =>
# best')``); every other argument at its default is left out
_NAMED = frozenset({"experiment", "run_dir", "weights", "source"})


def shown(root: Path, path: str | Path | None) -> str | None:
    """``path`` relative to ``root`` when inside it (as tool arguments are written)."""
    if path is None:
        return None
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


def arguments(model: type[CallModel], args: Mapping[str, Any]) -> dict[str, Any]:
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


def spec_arguments(spec: JobSpec, root: Path, **changes: Any) -> dict[str, Any]:
    """A job's call as its tool's arguments (paths shown from the root), ``changes`` applied."""
    args = spec.call.model_dump(by_alias=True)
    for path in ("run_dir", "save"):
        if args.get(path) is not None:
            args[path] = shown(root, args[path])
    return arguments(type(spec.call), {**args, **changes})


def nothing_to_train(args: Mapping[str, Any], run: str, epoch: int, max_epochs: int) -> ConfigError:
    """The refusal of a resume that would train nothing (the run reached ``max_epochs``);
    ``args`` are the training call's arguments, ``resume`` among them."""
    more = epoch + max_epochs
    again = {**args, "overrides": {**(args.get("overrides") or {}), "max_epochs": more}}
    return ConfigError(
        arg("resume", args.get("resume")),
        f" has nothing to train: run {run} reached epoch {epoch}, and max_epochs is "
        f"{max_epochs}. To train further, pass a larger max_epochs, e.g. ",
        arg("overrides", {"max_epochs": more}),
        ": ",
        Call("train", again),
        ".",
    )
