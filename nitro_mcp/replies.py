"""Replies an agent can afford.

Four rules, each one place:

- A tool's reply is compact JSON: the text content is the structured content without
  indentation (the SDK would indent it), so the two say the same in the fewest characters.
- A list in a reply is paged by size as well as by count: :func:`fit` says how many items
  fit in a page's share of the budget, so a default reply stays under ``REPLY_MAX``
  characters whatever the run holds (long file names, many metrics), and ``next_cursor``
  gives the rest.
- Free-form data in a reply (a record's header, what an average was made of) is cut to a
  share of the budget by :func:`shrink`, which says what it left out.
- The tool listing (``tools/list``) is trimmed to what an agent reads: input schemas keep
  their descriptions and defaults but lose pydantic's titles, and ``X | None`` is written
  ``"type": [X, "null"]``; an output schema says only that the reply is an object (its
  fields are in the tool's description and in every reply). The complete schemas stay in
  ``schemas/`` (``list_tools(full=True)`` gives them).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, InputRequiredResult, TextContent
from mcp.types import Tool as MCPTool
from pydantic import BaseModel, ValidationError

from nitro_mcp.arguments import argument_errors

REPLY_MAX = 8_000  # characters of a default reply's text
PAGE_BUDGET = 6_000  # characters a page's items may take, leaving room for the rest
_SCHEMA_MAPS = ("properties", "$defs", "patternProperties")  # name -> schema, not keywords
_LITERAL = ("default", "const", "enum", "examples")  # values, not schemas


def compact(result: Any) -> Any:
    """A pydantic reply as a ``CallToolResult`` whose text is its compact JSON; anything
    else (an image, a result built already) unchanged."""
    if not isinstance(result, BaseModel):
        return result
    data = json.loads(result.model_dump_json())  # JSON data: NaN and infinities as null
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


def fit(items: Sequence[BaseModel], limit: int, budget: int = PAGE_BUDGET) -> int:
    """How many of the first ``limit`` items fit in ``budget`` characters of compact JSON
    (at least one, so that paging always moves on)."""
    used = 0
    for count, item in enumerate(items[:limit]):
        used += len(item.model_dump_json()) + 1
        if used > budget and count > 0:
            return count
    return min(limit, len(items))


def shrink(value: Any, budget: int) -> Any:
    """JSON data within ``budget`` characters of compact JSON. Data that is over keeps the
    first and last items of each long list and the start of each long string (saying what
    was left out), cut harder until it fits; the keys of a large object go last."""
    if _size(value) <= budget:
        return value
    for items, chars, keys in ((20, 400, None), (6, 120, None), (2, 40, 50), (2, 40, 10)):
        cut = _cut(value, items, chars, keys)
        if _size(cut) <= budget:
            return cut
    return f"(omitted: {_size(value)} characters)"


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str))


def _cut(value: Any, items: int, chars: int, keys: int | None) -> Any:
    if isinstance(value, str):
        return value if len(value) <= chars else f"{value[:chars]}… ({len(value)} characters)"
    if isinstance(value, list):
        if len(value) > items:
            half = items // 2
            gap = f"… {len(value) - 2 * half} more"
            value = [*value[:half], gap, *value[len(value) - half :]]
        return [_cut(v, items, chars, keys) for v in value]
    if isinstance(value, dict):
        names = list(value) if keys is None else list(value)[:keys]
        out = {k: _cut(value[k], items, chars, keys) for k in names}
        if len(names) < len(value):
            out["…"] = f"{len(value) - len(names)} more"
        return out
    return value


class NitroServer(MCPServer):
    """``MCPServer`` whose tool listing is trimmed for agents (the module docstring says how)
    and whose refusal of a call's arguments says what to send (``arguments.argument_errors``)
    instead of repeating pydantic's report."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Any = None
    ) -> CallToolResult | InputRequiredResult:
        tool = self._tool_manager.get_tool(name)
        if tool is not None:
            try:
                tool.fn_metadata.validate_arguments(arguments)
            except ValidationError as exc:
                raise ToolError(
                    f"Error executing tool {name}: {argument_errors(tool.parameters, exc)}"
                ) from exc
        return await super().call_tool(name, arguments, context)

    async def list_tools(self, full: bool = False) -> list[MCPTool]:
        tools = await super().list_tools()
        if full:
            return tools
        return [
            tool.model_copy(
                update={
                    "input_schema": trim_input(tool.input_schema),
                    "output_schema": trim_output(tool.output_schema),
                }
            )
            for tool in tools
        ]


def trim_input(schema: Any, top: bool = True) -> Any:
    """The schema without titles, the top level's ``additionalProperties: false`` (the
    server refuses an unknown argument by name) or a default ``true``; an optional argument whose default is null
    is listed by its other type (leaving it out says null), and ``anyOf`` of plain types
    becomes a list of types."""
    if isinstance(schema, list):
        return [trim_input(s, False) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in _plain_union(_not_null(schema)).items():
        if key == "title" or (key == "additionalProperties" and value is (False if top else True)):
            continue  # additionalProperties: true is the default anyway
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: trim_input(s, False) for name, s in value.items()}
        else:
            out[key] = value if key in _LITERAL else trim_input(value, False)
    return out


def _not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``{"anyOf": [X, {"type": "null"}], "default": null, ...}`` as ``{**X, ...}``."""
    arms = schema.get("anyOf")
    if "default" not in schema or schema["default"] is not None or not isinstance(arms, list):
        return schema
    rest = [a for a in arms if a != {"type": "null"}]
    if len(rest) == len(arms):
        return schema
    kept = {k: v for k, v in schema.items() if k not in ("anyOf", "default")}
    return {**rest[0], **kept} if len(rest) == 1 else {**kept, "anyOf": rest}


def trim_output(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """An object: the reply's fields are in the tool's description and in every reply, and
    the complete schema is in ``schemas/``."""
    return None if schema is None else {"type": "object"}


def _plain_union(schema: dict[str, Any]) -> dict[str, Any]:
    arms = schema.get("anyOf")
    if isinstance(arms, list) and arms and all(_plain(a) for a in arms):
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        return {**rest, "type": [a["type"] for a in arms]}
    return schema


def _plain(arm: Any) -> bool:
    """``{"type": X}`` (an open object counts: ``additionalProperties: true`` is the default)."""
    return (
        isinstance(arm, dict)
        and isinstance(arm.get("type"), str)
        and set(arm) <= {"type", "additionalProperties"}
        and arm.get("additionalProperties", True) is True
    )
