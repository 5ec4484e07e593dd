"""Refusals written as ``nitro`` commands, for a person at a terminal.

The third audience of a ``NitroError``'s parts (:mod:`nitro_core.errors`): the library writes
them for Python (``Classifier(field=value)``, ``Nitro(exp, weights=...)``), the MCP layer for a
tool call (:mod:`nitro_mcp.refusals`), and :class:`TerminalRenderer` as the command line a
person types: ``--set hidden=<int>``, ``nitro train ... --weights 'latest => best'``,
``--restore-optimizer``, ``nitro manifest runs/Classifier``. It reads the parts only, never
the Python text. :func:`for_terminal` renders a refusal that way (``nitro`` applies it to
every ``NitroError``); :func:`command_line` writes one operation's arguments as a command.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nitro_core.errors import (
    Arg,
    Call,
    CheckpointerFix,
    FieldFix,
    Lister,
    NitroError,
    Part,
    Redo,
    render,
)

POSITIONAL = {"train": "experiment", "validate": "experiment", "average": "run_dir"}


@dataclass(frozen=True)
class TerminalRenderer:
    """Parts as a person types them after ``nitro COMMAND``."""

    command: str

    def render(self, part: Part) -> str:
        if isinstance(part, str):
            return part
        if isinstance(part, Arg):
            return " ".join(option(part.name, part.value)) or f"no --{_flag(part.name)}"
        if isinstance(part, Redo):
            return " ".join(["nitro", self.command, "...", *_redo_words(part.args)])
        if isinstance(part, Call):
            return command_line(part.operation, part.args)
        if isinstance(part, CheckpointerFix):
            return f"Checkpointer({part.arguments}){CheckpointerFix.OUTSIDE_A_CALL}"
        if isinstance(part, FieldFix):
            return _field_fix(part)
        if isinstance(part, Lister):
            return f"nitro manifest {shlex.quote(part.run_dir) if part.run_dir else 'RUN_DIR'}"
        return part.terminal or part.tool  # without terminal words of its own: the tool's


def for_terminal(error: NitroError, command: str) -> str:
    """``error`` written for a person who ran ``nitro command``."""
    return render(error.parts, TerminalRenderer(command))


def command_line(operation: str, args: Mapping[str, Any]) -> str:
    """``nitro OPERATION POSITIONAL --option value ...``: ``nitro train Regression --run-dir
    runs/r --resume auto --set max_epochs=4`` (a left-out argument keeps its default)."""
    first = POSITIONAL.get(operation)
    words = ["nitro", operation]
    if first is not None and args.get(first) is not None:
        words.append(shlex.quote(str(args[first])))
    for name, v in args.items():
        if name != first:
            words.extend(option(name, v))
    return " ".join(words)


def option(name: str, value: Any) -> list[str]:
    """One argument as the words of its option: ``--restore-optimizer``, ``--no-strict``,
    ``--weights 'latest => best'``, ``--set max_epochs=4`` per override; none for ``None``."""
    if value is None:
        return []
    if name == "overrides" and isinstance(value, Mapping):
        return [w for k, v in value.items() for w in ("--set", shlex.quote(f"{k}={_set_value(v)}"))]
    flag = f"--{_flag(name)}"
    if isinstance(value, bool):
        return [flag if value else f"--no-{_flag(name)}"]
    if isinstance(value, Mapping | list | tuple):
        return [flag, shlex.quote(json.dumps(value))]
    return [flag, shlex.quote(str(value))]


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _set_value(v: Any) -> str:
    """A ``--set`` value: a string as it stands (unless it would read as another JSON value),
    anything else as JSON."""
    if isinstance(v, str):
        try:
            json.loads(v)
        except json.JSONDecodeError:
            return v
    return json.dumps(v)


def _redo_words(args: tuple[Arg | str, ...]) -> list[str]:
    """A redo's arguments as options; a written one (``weights=...``) keeps its value."""
    words: list[str] = []
    for a in args:
        if isinstance(a, Arg):
            words.extend(option(a.name, a.value))
        else:
            name, _, rest = a.partition("=")
            words.extend([f"--{_flag(name)}", rest] if rest else [f"--{_flag(name)}"])
    return words


def _field_fix(fix: FieldFix) -> str:
    """The ``--set`` to write instead of ``Write Regression(field=value) with values that
    fit.``: the field's type, or the field nearest an unknown name."""
    if fix.field is not None:
        write = f"Write --set {fix.field}=<{fix.type}> with a value that fits"
    elif fix.unknown is not None:
        near = fix.nearest()
        example = f", e.g. --set {near}=..." if near else ""
        write = f"Write --set naming only those fields{example}"
    else:
        write = "Write --set FIELD=VALUE with values that fit"
    return f"{write}; nitro experiments {fix.experiment} lists its fields."
