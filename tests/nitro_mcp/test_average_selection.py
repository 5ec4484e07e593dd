"""The MCP average tool refuses, as the library does, an Average whose points the run no
longer holds (it never averages the survivors under the selector's name)."""

from __future__ import annotations

import anyio
from mcp import Client

from nitro_core import Nitro
from nitro_mcp.server import build_server

from ..nitro_core.tiny import Scripted
from .conftest import call


def test_average_tool_refuses_what_the_run_no_longer_holds(tmp_path):
    run_dir = tmp_path / "runs" / "s"
    n = Nitro(Scripted(keep="(Best(2), Last(1))"), run_dir=run_dir).train()

    async def go():
        async with Client(build_server(tmp_path)) as client:
            return await call(
                client, "average", run_dir="runs/s", source="latest => Average(Last(3))", wait_s=30
            )

    err, text = anyio.run(go)
    assert err
    assert (
        f"Last(3) names epochs 4, 5, 6 of run {n.run_id}, which kept epochs 2, 4, 6 under "
        "keep=(Best(2), Last(1)); it no longer holds 5. Keep them while training: "
        "Checkpointer(keep=(Best(2), Last(1), Last(3))) returned by the experiment's checkpointer() (a "
        "change to its module)." in text
    ), text
