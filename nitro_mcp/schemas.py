"""``nitro schemas``: JSON Schemas of every tool's input and output, the manifest entry and
the record header, generated from the server and the models themselves."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import anyio

from nitro_core.state.header import RecordHeader
from nitro_core.store.manifest import ManifestEntry
from nitro_mcp.replies import NitroServer


async def _tool_schemas() -> dict[str, Any]:
    from nitro_mcp.server import build_server  # lazy: the server imports torch

    with tempfile.TemporaryDirectory() as root:
        server = build_server(root)
        assert isinstance(server, NitroServer)
        tools = await server.list_tools(full=True)  # complete; the listing sent is trimmed
    out: dict[str, dict[str, Any] | None] = {}  # a tool without output has no schema
    for tool in tools:
        out[f"tools/{tool.name}.input.json"] = tool.input_schema
        out[f"tools/{tool.name}.output.json"] = tool.output_schema
    return out


def generate() -> dict[str, Any]:
    """File name (under schemas/) -> schema."""
    schemas = anyio.run(_tool_schemas)
    schemas["manifest-entry.json"] = ManifestEntry.model_json_schema()
    schemas["record-header.json"] = RecordHeader.model_json_schema()
    return schemas


def write(out: Path) -> list[Path]:
    written = []
    for name, schema in generate().items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
