"""Nitro's MCP server and the ``nitro`` command line."""

from nitro_mcp.cli import main

__all__ = ["main"]
