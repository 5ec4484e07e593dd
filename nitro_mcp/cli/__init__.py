"""The ``nitro`` command: one command per MCP tool, for people at a terminal.

The commands come by family, one module each, as the tools do (:mod:`nitro_mcp.tools`):

- :mod:`~nitro_mcp.cli.serving_commands`: ``serve`` (the MCP server), ``demo``, ``schemas``
- :mod:`~nitro_mcp.cli.training_commands`: ``train``, ``validate``, ``average`` (in this process)
- :mod:`~nitro_mcp.cli.job_commands`: ``jobs``, ``status``, ``stop`` (the server's jobs)
- :mod:`~nitro_mcp.cli.record_commands`: ``runs``, ``manifest``, ``info``, ``verify``, ``experiments``, ``push``
- :mod:`~nitro_mcp.cli.observing_commands`: ``history``, ``plot``, ``compare``
- :mod:`~nitro_mcp.cli.lifecycle_commands`: ``delete``, ``export``

Each calls the function its tool calls, prints lines for a person or with ``--json`` the
tool's data, and writes errors on stderr, a ``NitroError`` in the terminal's own spelling
(:mod:`nitro_mcp.terminal`). Exit status: 0 done, 2 refused input, 1 another failure
(:mod:`~nitro_mcp.cli.common`). This is an edge of the program, so it prints; the
libraries it calls never do. Torch loads only in the commands that need it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from nitro_core._version import __version__
from nitro_core.errors import NitroError
from nitro_mcp.cli import (
    job_commands,
    lifecycle_commands,
    observing_commands,
    record_commands,
    serving_commands,
    training_commands,
)
from nitro_mcp.cli.common import FAILED, REFUSED, Handler, refused, say
from nitro_mcp.terminal import for_terminal

FAMILIES = (  # the order of --help
    serving_commands,
    training_commands,
    job_commands,
    record_commands,
    observing_commands,
    lifecycle_commands,
)


def _parser() -> argparse.ArgumentParser:
    return _build()[0]


def _build() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    parser = argparse.ArgumentParser(
        prog="nitro",
        description="Nitro: trustworthy PyTorch checkpoints, and an MCP server for agents.",
        epilog="example:\n  nitro demo\n\n`nitro COMMAND --help` says what a command does, "
        "with an example; --json prints a command's result as JSON.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"nitro {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers: dict[str, Handler] = {}
    for family in FAMILIES:
        handlers.update(family.add(sub))
    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    parser, handlers = _build()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `train --nproc` relaunches it
    try:
        return handlers[args.command](args)
    except NitroError as exc:  # what to type instead, as a command
        say(f"nitro {args.command}: {for_terminal(exc, args.command)}")
        return REFUSED if refused(exc) else FAILED
    except ValidationError as exc:
        say(f"nitro {args.command}: {exc.errors()[0]['msg']}")
        return REFUSED
    except OSError as exc:  # the file system refused what the checks let through
        say(f"nitro {args.command}: {exc}")
        return FAILED


__all__ = ["main"]
