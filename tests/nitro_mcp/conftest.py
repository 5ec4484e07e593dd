"""Fixtures for the MCP tests: a server over a temporary root, and a finished training run
in a shared root so most tests need not train."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client

from nitro_mcp.server import build_server

FAST = {"max_epochs": 3, "samples": 256}


async def call(client: Client, name: str, **args):
    """Call a tool; returns (is_error, structured result or error text)."""
    result = await client.call_tool(name, args)
    if result.is_error:
        return True, result.content[0].text
    return False, result.structured_content


async def wait_done(client: Client, job_id: str, limit: float = 120) -> dict:
    with anyio.fail_after(limit):
        while True:
            err, status = await call(client, "nitro_status", job_id=job_id, wait_s=10)
            assert not err, status
            if status["state"] not in ("queued", "running"):
                return status


@pytest.fixture(scope="session")
def trained_root(tmp_path_factory):
    """A root holding runs/Classifier, trained by a real worker through the server."""
    root = tmp_path_factory.mktemp("root")

    async def train():
        async with Client(build_server(root)) as client:
            err, job = await call(client, "nitro_train", experiment="Classifier", overrides=FAST)
            assert not err, job
            status = await wait_done(client, job["job_id"])
            assert status["state"] == "succeeded", status
            return status

    status = anyio.run(train)
    return root, status
