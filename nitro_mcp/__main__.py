"""``python -m nitro_mcp ...`` is ``nitro ...``."""

from nitro_mcp.cli import main

raise SystemExit(main())
