"""``python -m nitro_mcp.cli``: the ``nitro`` command (the demo and the ranks of
``nitro train --nproc`` start it this way)."""

from nitro_mcp.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
