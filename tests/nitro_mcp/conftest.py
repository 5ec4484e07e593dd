"""Fixtures for the MCP tests: a server over a temporary root, and a finished training run
in a shared root so most tests need not train."""

from __future__ import annotations

import os

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


async def wait_done(client: Client, job_id: str, limit: float = 300) -> dict:
    """The job's full status once it ended, however slow the machine (at most ``limit`` s)."""
    with anyio.fail_after(limit):
        while True:
            err, status = await call(client, "nitro_status", job_id=job_id, wait_s=10)
            assert not err, status
            if status["state"] not in ("queued", "running"):
                return status


async def ended(client: Client, reply: tuple, root=None, limit: float = 300) -> tuple:
    """A ``nitro_validate`` or ``average`` reply (as ``call`` returns it) as it reads once its
    job ended: when the call's ``wait_s`` passed first (a loaded machine), the job is followed
    with nitro_status and the reply's fields are filled from the job's result, paths shown
    relative to ``root`` as the tool shows them."""
    err, body = reply
    if err or body["state"] not in ("queued", "running"):
        return reply
    status = await wait_done(client, body["job_id"], limit)
    result = status.get("result") or {}
    out = {**body, "state": status["state"], "error": status.get("error"), "next": status["next"]}
    for key in ("metrics", "averaged_from", "saved", "checkpoint"):
        if key in body:
            value = result.get(key)
            if key in ("saved", "checkpoint") and value and root is not None:
                value = os.path.relpath(value, root)
            out[key] = value
    out["warnings"] = list(dict.fromkeys([*body["warnings"], *(result.get("warnings") or [])]))
    return False, out


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
