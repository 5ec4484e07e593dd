"""Nitro's MCP server (``build_server``), the gate it calls (``Gate``), and the ``nitro``
command line (``nitro_mcp.cli``). The names load lazily, so ``nitro --help`` imports no
torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {"Gate": "nitro_mcp.gate", "build_server": "nitro_mcp.server"}

if TYPE_CHECKING:
    from nitro_mcp.gate import Gate as Gate
    from nitro_mcp.server import build_server as build_server


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'nitro_mcp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["Gate", "build_server"]
