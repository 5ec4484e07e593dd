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
- The tool listing (``tools/list``) carries every tool's input and output schema, written
  short by :class:`ListingSchema` (no titles, nullable types as type lists), so the whole
  listing stays under ``LISTING_MAX`` characters of compact JSON. The complete schemas, with
  titles, stay in ``schemas/`` (``list_tools(full=True)`` gives them).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, InputRequiredResult, TextContent
from mcp.types import Tool as MCPTool
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import DEFAULT_REF_TEMPLATE, GenerateJsonSchema, JsonRef, JsonSchemaValue
from pydantic_core import core_schema

from nitro_mcp.arguments import argument_errors

REPLY_MAX = 8_000  # characters of a default reply's text
PAGE_BUDGET = 6_000  # characters a page's items may take, leaving room for the rest
LISTING_MAX = 16_000  # characters of the whole tool listing, compact JSON, output schemas included


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
    """``MCPServer`` whose tools each have an arguments model of their own (refusing an
    unknown argument, and any refused argument answered by ``arguments.argument_errors``
    in words that say what to send) and whose tool listing is compact for agents: the
    schemas of the listing come from :class:`ListingSchema` (the complete ones, with
    titles, from pydantic's default generator: ``list_tools(full=True)`` and ``schemas/``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arguments: dict[str, type[BaseModel]] = {}  # tool name -> its arguments model
        self._returns: dict[str, type[BaseModel] | None] = {}  # and its reply model

    def add_nitro_tool(
        self, fn: Callable[..., Any], arguments: type[BaseModel], description: str
    ) -> None:
        """Register ``fn`` (whose signature the SDK reads) as a tool taking ``arguments``."""
        returns = inspect.signature(fn, eval_str=True).return_annotation
        model = returns if isinstance(returns, type) and issubclass(returns, BaseModel) else None
        self._arguments[fn.__name__], self._returns[fn.__name__] = arguments, model
        self.add_tool(fn, description=description)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Any = None
    ) -> CallToolResult | InputRequiredResult:
        model = self._arguments.get(name)
        if model is not None:
            try:
                model.model_validate(_pre_parse(model, arguments))
            except ValidationError as exc:
                raise ToolError(
                    f"Error executing tool {name}: {argument_errors(model, exc)}"
                ) from exc
        return await super().call_tool(name, arguments, context)

    async def list_tools(self, full: bool = False) -> list[MCPTool]:
        tools = await super().list_tools()
        out = []
        for tool in tools:
            model, returns = self._arguments.get(tool.name), self._returns.get(tool.name)
            if model is None:  # not a Nitro tool: as the SDK lists it
                out.append(tool)
                continue
            schemas: dict[str, Any] = {"input_schema": _schema(model, full)}
            if not full:  # the complete output schema is the SDK's, from the same model
                schemas["output_schema"] = (
                    None if returns is None else _schema(returns, False, True)
                )
            out.append(tool.model_copy(update=schemas))
        return out


def _pre_parse(model: type[BaseModel], arguments: dict[str, Any]) -> dict[str, Any]:
    """``arguments`` as the SDK reads them: a list or an object sent as JSON text, to an
    argument that takes no string, is the list or object it spells."""
    fields = {info.alias or name: info for name, info in model.model_fields.items()}
    out = dict(arguments)
    for key, value in arguments.items():
        info = fields.get(key)
        if info is None or not isinstance(value, str) or info.annotation is str:
            continue
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            continue
        if not isinstance(parsed, str | int | float):
            out[key] = parsed
    return out


@functools.cache
def _schema(model: type[BaseModel], full: bool, output: bool = False) -> dict[str, Any]:
    if full:
        return model.model_json_schema(by_alias=True)
    generator = OutputListingSchema if output else ListingSchema
    return model.model_json_schema(by_alias=True, schema_generator=generator)


class ListingSchema(GenerateJsonSchema):
    """The input schemas of the tool listing, as short as they can be and still say what to
    send: no titles (the names say it) and no ``additionalProperties: false`` (an unknown
    argument is refused by name), ``X | None`` written ``"type": [X, "null"]``, an optional
    argument whose default is null listed by its other type (leaving it out says null), an
    enum without its type, and an object of any values written ``{"type": "object"}``.
    Enums, bounds, defaults and descriptions stay; nested models are shared ``$defs``. A
    string's ``pattern`` (Slurm's options) is left to the complete schemas (``schemas/``,
    ``list_tools(full=True)``) and to the refusal, which quotes it."""

    def __init__(self, by_alias: bool = True, ref_template: str = DEFAULT_REF_TEMPLATE,
                 union_format: Any = "primitive_type_array") -> None:  # fmt: skip
        super().__init__(by_alias, ref_template, union_format="primitive_type_array")

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def generate(self, schema: Any, mode: Any = "validation") -> JsonSchemaValue:
        """pydantic's schema, with each definition that one place refers to written in that
        place (as pydantic does for the top-level model); a definition referred to twice or
        more, or by itself, stays shared in ``$defs``."""
        out = super().generate(schema, mode)
        defs = out.pop("$defs", {})
        counts = Counter(_refs(out) + [r for d in defs.values() for r in _refs(d)])
        once = {name for name in defs if counts[name] == 1 and name not in _refs(defs[name])}
        out = _inline(out, defs, once)
        kept = {name: _inline(d, defs, once) for name, d in defs.items() if name not in once}
        return {**out, "$defs": kept} if kept else out

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        out = super().model_schema(schema)
        out.pop("title", None)
        out.pop("description", None)  # a class's docstring; the field naming it says enough
        if out.get("additionalProperties") is False:
            del out["additionalProperties"]
        return out

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        inner = schema["schema"]
        while inner["type"] == "function-before":  # a field's own check shows no schema
            inner = inner["schema"]
        if schema.get("default", ...) is None and inner["type"] == "nullable":
            return self.generate_inner(inner["schema"])
        return super().default_schema(schema)

    def str_schema(self, schema: core_schema.StringSchema) -> JsonSchemaValue:
        out = super().str_schema(schema)
        out.pop("pattern", None)
        return out

    def literal_schema(self, schema: core_schema.LiteralSchema) -> JsonSchemaValue:
        out = super().literal_schema(schema)
        if "enum" in out:
            out.pop("type", None)  # the values say it
        return out

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        out = super().dict_schema(schema)
        if out.get("additionalProperties") is True:
            del out["additionalProperties"]  # true is the default
        return out

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        """``X | None``: an enum with null among its values, a typed schema with ``"null"``
        among its types; only a reference stays ``anyOf: [X, {"type": "null"}]``."""
        inner = self.generate_inner(schema["schema"])
        if "$ref" in inner or "anyOf" in inner:
            return {"anyOf": [inner, {"type": "null"}]}
        if "enum" in inner and "type" not in inner:
            return {**inner, "enum": [*inner["enum"], None]}
        kind = inner.get("type")
        if isinstance(kind, str):
            return {**inner, "type": [kind, "null"]}
        if isinstance(kind, list):
            return {**inner, "type": [*kind, *(["null"] if "null" not in kind else [])]}
        return {"anyOf": [inner, {"type": "null"}]}


_REF = "#/$defs/"


def _refs(schema: Any) -> list[str]:
    """The names of the definitions ``schema`` refers to, once per reference."""
    if isinstance(schema, dict):
        here = [schema["$ref"].removeprefix(_REF)] if isinstance(schema.get("$ref"), str) else []
        return here + [r for v in schema.values() for r in _refs(v)]
    if isinstance(schema, list):
        return [r for v in schema for r in _refs(v)]
    return []


def _inline(schema: Any, defs: dict[str, Any], once: set[str]) -> Any:
    """``schema`` with each reference to a definition in ``once`` replaced by the definition
    (``X | None`` of one: the object with ``"null"`` among its types)."""
    if isinstance(schema, list):
        return [_inline(v, defs, once) for v in schema]
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.removeprefix(_REF) in once:  # beside it: a description
        siblings = {k: v for k, v in schema.items() if k != "$ref"}
        return {**_inline(defs[ref.removeprefix(_REF)], defs, once), **siblings}
    choices = schema.get("anyOf")
    if isinstance(choices, list) and len(schema) == 1 and {"type": "null"} in choices:
        inner = [_inline(c, defs, once) for c in choices if c != {"type": "null"}]
        if len(inner) == 1 and inner[0].get("type") == "object":
            return {**inner[0], "type": ["object", "null"]}
    return {k: _inline(v, defs, once) for k, v in schema.items()}


class OutputListingSchema(ListingSchema):
    """The output schemas of the tool listing: the replies' structure (every field, its
    type, null where a reply may hold null, enums), without the descriptions and defaults
    (the tool's description and ``schemas/`` say what each field means) and without
    ``required``: a reply holds every field of its model (null where its type allows), so the
    list would name them all again."""

    def field_is_required(self, field: Any, total: bool) -> bool:
        return False

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])  # a reply's field has no default; null stays

    # a reply's numbers and strings by their type: the bounds and patterns a reply always
    # meets are no argument's to respect (``schemas/`` keeps them)
    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        return {"type": "integer"}

    def str_schema(self, schema: core_schema.StringSchema) -> JsonSchemaValue:
        return {"type": "string"}

    def model_fields_schema(self, schema: core_schema.ModelFieldsSchema) -> JsonSchemaValue:
        """A reply's fields; one that is a model of its own (a group, the epoch in progress)
        as an object, its fields named in ``schemas/``, as a list of objects is."""
        out = super().model_fields_schema(schema)
        properties = out.get("properties", {})
        for name, prop in properties.items():
            prop.pop("description", None)
            if isinstance(prop.get("$ref"), str):
                properties[name] = {"type": "object"}
            choices = prop.get("anyOf")
            if isinstance(choices, list) and len(choices) == 2 and {"type": "null"} in choices:
                if any(isinstance(c, dict) and "$ref" in c for c in choices):
                    properties[name] = {"type": ["object", "null"]}
        return out

    def list_schema(self, schema: core_schema.ListSchema) -> JsonSchemaValue:
        """A list of objects (a page's entries, jobs, runs) as an array of objects: the items'
        fields are what the reply shows, and ``schemas/`` names them; so the listing stays
        within its budget (``LISTING_MAX``). A list of anything else keeps its items' schema."""
        out = super().list_schema(schema)
        items = out.get("items")
        if isinstance(items, dict) and self._an_object(items):
            return {**out, "items": {"type": "object"}}
        return out

    def _an_object(self, items: JsonSchemaValue) -> bool:
        """Whether ``items`` (or the definition it refers to) is an object with fields."""
        ref = items.get("$ref")
        if isinstance(ref, str):
            target = self.get_schema_from_definitions(JsonRef(ref))
            return target is not None and self._an_object(target)
        return items.get("type") == "object" and "properties" in items
