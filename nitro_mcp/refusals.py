"""Refusals written as the tool's arguments.

A ``NitroError`` carries its parts as data (:mod:`nitro_core.errors`); the library writes
them for a Python caller (``Regression(field=value)``, ``Nitro(exp, weights=...)``,
``restore_optimizer=True``). :class:`ToolRenderer` writes the same parts for a client of
one tool: ``overrides={"hidden": <int>}``, ``nitro_train(..., weights=...)``,
``restore_optimizer=true``, and, where no argument can help (the checkpoints a run keeps),
the change to the experiment's module. It reads the parts only, never the Python text, so a
reworded library message keeps its tool form. :func:`for_tool` renders a refusal that way
(the server applies it to every ``NitroError``), :func:`job_error` a failed job's error
from the parts its worker stored.
"""

from __future__ import annotations

from dataclasses import dataclass

from nitro_core.errors import (
    Arg,
    Call,
    CheckpointerFix,
    FieldFix,
    Lister,
    NitroError,
    Part,
    Redo,
    parts_from_json,
    render,
)
from nitro_core.jobs.files import JobStatus
from nitro_mcp.tool_calls import TOOLS, tool_call, value

REFUSAL_HEAD, REFUSAL_TAIL = 3_000, 2_000  # characters kept of a refusal's start and end
ERROR_MAX = 2_000  # characters of a job's error in a reply; the log holds all of it


@dataclass(frozen=True)
class ToolRenderer:
    """Parts as a client of ``tool`` sends them."""

    tool: str

    def render(self, part: Part) -> str:
        if isinstance(part, str):
            return part
        if isinstance(part, Arg):
            return f"{part.name}={value(part.value)}"
        if isinstance(part, Redo):
            return f"{self.tool}(..., {', '.join(self.render(a) for a in part.args)})"
        if isinstance(part, Call):
            return tool_call(TOOLS[part.operation], part.args)
        if isinstance(part, CheckpointerFix):
            return f"Checkpointer({part.arguments}){CheckpointerFix.OUTSIDE_A_CALL}"
        if isinstance(part, FieldFix):
            return _field_fix(part)
        if isinstance(part, Lister):
            return "nitro_manifest"
        return part.tool


def for_tool(error: NitroError | str, tool: str) -> str:
    """``error`` written for a call of ``tool`` (a plain text stands as it is), its middle
    cut when it is long (a listing of every epoch of many runs): the start says what
    failed, the end what to send instead."""
    text = error if isinstance(error, str) else render(error.parts, ToolRenderer(tool))
    if len(text) <= REFUSAL_HEAD + REFUSAL_TAIL:
        return text
    cut = len(text) - REFUSAL_HEAD - REFUSAL_TAIL
    return f"{text[:REFUSAL_HEAD]} … ({cut} characters left out) … {text[-REFUSAL_TAIL:]}"


def job_error(status: JobStatus) -> str | None:
    """A job's recorded error, written for the tool that started the job from the parts
    its worker stored (an error without them, such as an older job's, as recorded), and
    cut to ``ERROR_MAX`` characters (an exception's text can hold anything)."""
    if status.error is None:
        return None
    text = status.error
    if status.refusal is not None:
        text = render(parts_from_json(status.refusal), ToolRenderer(TOOLS[status.kind]))
    if len(text) <= ERROR_MAX:
        return text
    return f"{text[:ERROR_MAX]}… ({len(text)} characters; the job's log holds the whole error)"


def _field_fix(fix: FieldFix) -> str:
    """The overrides to send instead of ``Write Regression(field=value) with values that
    fit.``: the field's type, or the field nearest an unknown name."""
    if fix.field is not None:
        send = f'Send overrides={{"{fix.field}": <{fix.type}>}} with a value that fits'
    elif fix.unknown is not None:
        near = fix.nearest()
        example = f', e.g. overrides={{"{near}": ...}}' if near else ""
        send = f"Send overrides naming only those fields{example}"
    else:
        send = "Send overrides with values that fit"
    return f"{send}; nitro_experiments lists {fix.experiment}'s fields."
