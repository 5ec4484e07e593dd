"""Declaring a tool: how a family module turns a function into an MCP tool.

A tool function either takes a call model's fields flat (``tool(server, description,
arguments)``, the arguments model made by :func:`nitro_mcp.arguments.arguments_model`) or
declares its own annotated parameters. Every tool's ``NitroError`` becomes a ``ToolError``
written as that tool's arguments (:func:`nitro_mcp.refusals.for_tool`); an ``OSError`` the
checks did not foresee becomes an actionable one too; a pydantic reply goes out as compact
JSON beside its structured content. Blocking gate work runs off the event loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import anyio
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from nitro_core.errors import NitroError
from nitro_core.jobs.call_models import Refusal
from nitro_mcp.arguments import flat, signature_model
from nitro_mcp.echo import clip
from nitro_mcp.refusals import for_tool
from nitro_mcp.replies import NitroServer, compact

C = TypeVar("C", bound=BaseModel)
Register = Callable[[Callable[..., Any]], Callable[..., Any]]


def wait_parameter(most: int, what: str, default: float) -> Any:
    """A ``wait_s`` parameter: 0 to ``most`` seconds."""
    return (
        Annotated[
            float,
            Field(ge=0, le=most, description=f"Seconds to wait for {what}."),
            Refusal(f"wait_s={{value}} is out of range; give 0 to {most} seconds."),
        ],
        default,
    )


def _limit_refusal(most: int) -> Refusal:
    return Refusal(f"limit={{value}} is out of range; give 1 to {most}.")


JobsLimit = Annotated[int, Field(ge=1, le=100, description="Per page."), _limit_refusal(100)]
RunsLimit = Annotated[int, Field(ge=1, le=100, description="Per page."), _limit_refusal(100)]
EntriesLimit = Annotated[int, Field(ge=1, le=200, description="Per page."), _limit_refusal(200)]
Cursor = Annotated[str | None, Field(description="A next_cursor.")]


def call_of(model: type[C], arguments: BaseModel) -> C:
    """The call in a tool's arguments: the fields of ``model``, without the tool's own."""
    return model.model_validate(arguments.model_dump(include=set(model.model_fields)))


def tool(
    server: NitroServer, description: str, arguments: type[BaseModel] | None = None
) -> Register:
    """Register a tool function: with ``arguments`` (a call model's), ``fn(arguments, ctx)``
    takes that model's fields flat; without, the function's own parameters."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        model = arguments or signature_model(fn)
        declared = fn if arguments is None else flat(fn, model)
        server.add_nitro_tool(_tool_errors(declared), model, description)
        return fn

    return register


def _tool_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return compact(await fn(*args, **kwargs))  # compact JSON beside the structured content
        except NitroError as exc:  # what to send instead, written as this tool's arguments
            raise ToolError(for_tool(exc, fn.__name__)) from exc
        except OSError as exc:  # the file system refused something the checks let through
            where = f" at {clip(exc.filename)}" if exc.filename else ""
            raise ToolError(
                f"{fn.__name__} failed: {exc.strerror or type(exc).__name__}{where}. Check the "
                "path arguments (inside the server's root, names of at most 255 bytes, "
                "directories where a directory is meant) and the disk, then call again."
            ) from exc

    return wrapper


async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking gate call (file reads, a worker launch) on a worker thread, so that
    long-polls and other clients are not held up."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args))


def progress_of(ctx: Context | None) -> Any:
    """The client's progress notifications for this call (None when it asked for none)."""
    if ctx is None:
        return None

    async def send(progress: float, total: float | None, message: str | None) -> None:
        await ctx.report_progress(progress, total, message)

    return send
