"""Refusals written as the tool's arguments.

The library's messages tell a Python caller what to write (``Regression(field=value)``,
``Nitro(exp, weights=...)``, ``restore_optimizer=True``). Through MCP the same refusal must
say what to send: ``overrides={"hidden": <int>}``, ``nitro_train(..., weights=...)``,
``restore_optimizer=true``, and, where no argument can help (the checkpoints a run keeps),
the change to the experiment's module. :func:`for_tool` rewrites a message that way; the
server applies it to every refusal, and :func:`job_error` to a failed job's error. The rewrites are a table of the library's phrasings,
each covered by a test that asserts the whole message.
"""

from __future__ import annotations

import difflib
import re

from nitro_core.jobs.files import JobStatus

_CONFIG_TAIL = re.compile(r"\. Write (\w+)\(field=value\) with values that fit\.$")
_TYPED_FIELD = re.compile(r"field '(\w+)' expects ([\w\[\], |.]+?), got")
_UNKNOWN_FIELD = re.compile(r"unknown field '([^']*)'; \w+ has the fields: ([\w, ]*)")
_NITRO_CALL = re.compile(r"Nitro\(exp, ([^()]*)\)")
_FLAGS = "resume|restore_best|restore_optimizer|strict|load_ema|validate|dry_run|force|brief"
_PY_BOOL = re.compile(rf"\b({_FLAGS})=(True|False)\b")  # tool arguments only, not module code
_RESTORE_BEST = (
    "write True (the run's best checkpoint), False, or an average such as Average(Last(10)) or "
    "'Average(Last(10))'.",
    "send restore_best=true (the run's best checkpoint), false, or an average such as "
    "'Average(Last(10))'.",
)
_MODULE_CHANGE = " returned by the experiment's checkpointer() (a change to its module)"


REFUSAL_HEAD, REFUSAL_TAIL = 3_000, 2_000  # characters kept of a refusal's start and end


def for_tool(text: str, tool: str) -> str:
    """``text`` with each Python construction it suggests written for a call of ``tool``,
    and its middle cut when it is long (a listing of every epoch of many runs): the start
    says what failed, the end what to send instead."""
    text = _config_fix(text)
    text = text.replace(*_RESTORE_BEST)
    text = _NITRO_CALL.sub(lambda m: f"{tool}(..., {m.group(1)})", text)
    text = _PY_BOOL.sub(lambda m: f"{m.group(1)}={m.group(2).lower()}", text)
    text = _checkpointer_fix(text)
    if len(text) <= REFUSAL_HEAD + REFUSAL_TAIL:
        return text
    cut = len(text) - REFUSAL_HEAD - REFUSAL_TAIL
    return f"{text[:REFUSAL_HEAD]} … ({cut} characters left out) … {text[-REFUSAL_TAIL:]}"


_TOOL_OF_KIND = {"train": "nitro_train", "validate": "nitro_validate", "average": "average"}


ERROR_MAX = 2_000  # characters of a job's error in a reply; the log holds all of it


def job_error(status: JobStatus) -> str | None:
    """A job's recorded error, written for the tool that started the job, and cut to
    ``ERROR_MAX`` characters (an exception's text can hold anything)."""
    if status.error is None:
        return None
    text = for_tool(status.error, _TOOL_OF_KIND.get(status.kind, "nitro_train"))
    if len(text) <= ERROR_MAX:
        return text
    return f"{text[:ERROR_MAX]}… ({len(text)} characters; the job's log holds the whole error)"


def _config_fix(text: str) -> str:
    """``Write Regression(field=value) with values that fit.`` as the overrides to send."""
    tail = _CONFIG_TAIL.search(text)
    if tail is None:
        return text
    name = tail.group(1)
    typed = _TYPED_FIELD.search(text)
    unknown = _UNKNOWN_FIELD.search(text)
    if typed is not None:
        fix = f'Send overrides={{"{typed.group(1)}": <{typed.group(2)}>}} with a value that fits'
    elif unknown is not None:
        fields = [f.strip() for f in unknown.group(2).split(",") if f.strip()]
        near = difflib.get_close_matches(unknown.group(1), fields, n=1) or fields[:1]
        example = f', e.g. overrides={{"{near[0]}": ...}}' if near else ""
        fix = f"Send overrides naming only those fields{example}"
    else:
        fix = "Send overrides with values that fit"
    return f"{text[: tail.start()]}. {fix}; nitro_experiments lists {name}'s fields."


def _checkpointer_fix(text: str) -> str:
    """Each ``Checkpointer(...)`` suggestion as the change to the experiment's module."""
    out, start = [], 0
    while (at := text.find("Checkpointer(", start)) >= 0:
        end = _closing(text, at + len("Checkpointer"))
        if end is None:
            break
        out.append(text[start : end + 1])
        if "=" in text[at:end]:  # a suggestion with arguments, not the class named in passing
            out.append(_MODULE_CHANGE)
        start = end + 1
    out.append(text[start:])
    return "".join(out)


def _closing(text: str, open_at: int) -> int | None:
    """The index of the parenthesis closing the one at ``open_at``."""
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return None
