"""Nitro's MCP server (``build_server``) and the ``nitro`` command line (``nitro_mcp.cli``)."""

from nitro_mcp.server import build_server
from nitro_mcp.tools import Gate

__all__ = ["Gate", "build_server"]
