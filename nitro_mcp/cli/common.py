"""What every ``nitro`` command shares: declaring it, its output and its exit status.

A command prints its result on stdout: lines for a person by default, or with ``--json`` the
data its MCP tool returns (the tool's reply model as JSON). Errors and prose go to stderr; a
``NitroError`` is written by :func:`nitro_mcp.terminal.for_terminal`, so its hints are
commands to type. Exit status: 0 done, 2 refused input (a bad option, a path that is not
there, a call the checks refuse), 1 any other failure. The root of the tools' checks (every
path resolves inside it) is ``--root``, by default the deepest directory holding the current directory and what the
command names.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from nitro_core.errors import (
    CheckpointNotFound,
    ConfigError,
    NitroError,
    ResumeRefused,
    UnsafePath,
)
from nitro_core.store.place import place

OK, FAILED, REFUSED = 0, 1, 2
Handler = Callable[[argparse.Namespace], int]
# the input was refused before anything ran: the exit status 2 of a bad option
REFUSALS: tuple[type[NitroError], ...] = (
    ConfigError,
    ResumeRefused,
    CheckpointNotFound,
    UnsafePath,
)


def command(
    sub: Any, name: str, summary: str, example: str, json_output: bool = True
) -> argparse.ArgumentParser:
    """A new command: ``summary`` in ``nitro --help`` and atop its own help, ``example``
    below it (tests/nitro_mcp/cli/test_cli_help.py parses each), and ``--json`` unless its
    output is a protocol or a narrative."""
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=summary, description=summary, epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    if json_output:
        p.add_argument(
            "--json", action="store_true", help="print the result as JSON (the MCP tool's data)"
        )
    return p


def root_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", help="paths resolve inside this directory (default: the current "
                   "directory, or the one holding the path given when it lies elsewhere)")  # fmt: skip


def emit(args: argparse.Namespace, data: Any, human: Callable[[], Iterable[str]]) -> None:
    """``data`` as JSON with ``--json`` (a reply model as the tool sends it), else the
    lines ``human`` writes."""
    if getattr(args, "json", False):
        if hasattr(data, "model_dump_json"):
            data = json.loads(data.model_dump_json())  # NaN and infinities as null, as a tool
        print(json.dumps(data, indent=2, default=str))
        return
    for line in human():
        print(line)


def refused(exc: BaseException) -> bool:
    """True when ``exc`` refused the input (exit status 2) rather than failed (1)."""
    return isinstance(exc, REFUSALS)


def root_of(args: argparse.Namespace, *paths: str | None, up: int = 1) -> Path:
    """The root the command's checks run in: ``--root``; else the deepest directory holding
    the current directory and, for each path named, the directory ``up`` levels above it (a
    run directory's parent, a record's run directory's parent). At a terminal every path the
    user names is theirs to name; the root only says where relative paths are shown from."""
    if getattr(args, "root", None):
        return Path(args.root).resolve()
    here = Path.cwd().resolve()
    holders = [str(here)]
    for text in paths:
        local = place(text).local_path() if text is not None else None
        if local is None:  # an object-store URL holds nothing local
            continue
        where = Path(os.path.abspath(local))
        holders.append(
            str(where.parents[min(up, len(where.parents)) - 1] if where.parents else where)
        )
    return Path(os.path.commonpath(holders))


def gate(args: argparse.Namespace, *paths: str | None, up: int = 1) -> Any:
    """The tools' :class:`~nitro_mcp.gate.Gate` over :func:`root_of` (it loads torch)."""
    from nitro_mcp.gate import Gate  # lazy: the registry imports torch

    modules = tuple(getattr(args, "experiment_module", ()) or ())
    return Gate(root_of(args, *paths, up=up), experiment_modules=modules, any_storage=True)


def absolute(text: str, keyword: str) -> str:
    """A path or URL as a command passes it on: a path made absolute, a URL as written."""
    local = place(text, keyword).local_path()
    return text if local is None else str(local.resolve())


def run_place(text: str) -> str:
    """A run directory as a command passes it on: an object-store URL as written (parsed),
    else an existing local directory (:func:`run_directory`), absolute."""
    where = place(text, "run_dir")
    if where.local_path() is None:  # an object-store URL, as parsed
        return str(where)
    return str(run_directory(text).resolve())


def run_directory(text: str) -> Path:
    """``text`` as an existing directory; a missing path or a file is refused (reading
    either as an empty run would answer a typo with nothing)."""
    path = Path(text)
    if not path.exists():
        raise ConfigError(
            f"{text!r} does not exist; give an existing run directory, e.g. runs/Classifier "
            "(the run_dir a training wrote to)."
        )
    if not path.is_dir():
        raise ConfigError(
            f"{text!r} is a file, not a directory; give a run directory, e.g. runs/Classifier."
        )
    return path


def say(text: str) -> None:
    """Prose for the person: stderr, so stdout stays the result."""
    print(text, file=sys.stderr)


def cell(v: Any) -> str:
    """A value in a table: numbers to 6 significant digits, nothing as '-'."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """Rows under a header, each column as wide as its widest cell."""
    cells = [header, *[[cell(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def count(low: int, high: int) -> Callable[[str], int]:
    """An option's whole number from ``low`` to ``high`` (the tool's bounds), else argparse's
    refusal (exit status 2): ``--limit 0 is not 1 to 100``."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = low - 1
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"{text} is not {low} to {high}; e.g. {high // 5}")
        return n

    return parse
