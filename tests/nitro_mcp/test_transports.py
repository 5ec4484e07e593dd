"""The server over real transports: a stdio subprocess, and streamable HTTP with a token."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from .conftest import call, ended, wait_done


@pytest.mark.slow  # a real worker end to end; `pytest -m slow`
def test_stdio_server_trains_validates_and_averages(tmp_path):
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "nitro_mcp.cli", "serve", "--root", str(tmp_path)],
        env=dict(os.environ),
    )

    async def main():
        async with Client(params) as client:
            err, job = await call(client, "nitro_train", experiment="Regression", overrides={"max_epochs": 3, "samples": 256},
                                  run_dir="runs/reg")  # fmt: skip
            assert not err, job
            status = await wait_done(client, job["job_id"])
            assert status["state"] == "succeeded" and status["epoch"] == 3
            err, val = await ended(client, await call(client, "nitro_validate", experiment="Regression", run_dir="runs/reg",
                                  weights="latest => best", overrides={"samples": 256}))  # fmt: skip
            assert not err and val["state"] == "succeeded" and "loss" in val["metrics"]
            err, avg = await ended(client, await call(client, "average", run_dir="runs/reg",
                                  source=f"{status['run_id']} => Average(Best(2))", save="runs/reg/avg.safetensors"),
                                  tmp_path)  # fmt: skip
            assert (
                not err
                and avg["state"] == "succeeded"
                and avg["saved"] == "runs/reg/avg.safetensors"
            )
            assert len(avg["averaged_from"]["files"]) == 2

    anyio.run(main)
    assert (tmp_path / "runs/reg/avg.safetensors").is_file()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server(tmp_path):
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nitro_mcp.cli", "serve", "--http", "--port", str(port), "--token", "s3cret",
         "--root", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 600  # a loaded machine may take minutes to start it
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.mark.slow  # a server in a subprocess: the slow suite (the default stays under 4 minutes)
def test_http_requires_the_bearer_token(http_server):
    refused = httpx2.post(http_server, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert refused.status_code == 401 and "bearer token" in refused.text
    wrong = httpx2.post(http_server, json={}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401

    async def main():
        async with httpx2.AsyncClient(
            headers={"Authorization": "Bearer s3cret"}, timeout=30
        ) as http:
            async with Client(streamable_http_client(http_server, http_client=http)) as client:
                tools = (await client.list_tools()).tools
                err, exps = await call(client, "nitro_experiments")
                return {t.name for t in tools}, err, exps

    names, err, exps = anyio.run(main)
    assert "nitro_train" in names and not err
    assert {e["name"] for e in exps["experiments"]} == {
        "CausalLM",
        "Classifier",
        "HFCausalLM",
        "Regression",
    }


def _imported(log) -> set[str]:
    """The modules a ``python -X importtime`` process has imported so far (its stderr)."""
    names = set()
    for line in log.read_text().splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


def test_nitro_serve_answers_initialize_and_tools_list_before_torch_loads(tmp_path):
    from mcp.client.stdio import stdio_client

    log = tmp_path / "imports.txt"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-X", "importtime", "-m", "nitro_mcp.cli", "serve", "--root", str(tmp_path)],
        env=dict(os.environ),
    )

    async def main():
        with log.open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:  # initialize
                tools = (await client.list_tools()).tools
                listed = _imported(log)
                err, experiments = await call(client, "nitro_experiments")
                assert not err, experiments
                return tools, listed, _imported(log), experiments

    tools, listed, later, experiments = anyio.run(main)
    assert len(tools) >= 16 and "nitro_mcp.server" in listed and "mcp" in listed
    assert "torch" not in listed, sorted(n for n in listed if n.startswith("torch"))[:5]
    # the first call that needs the experiments imports them, and torch with them
    assert "torch" in later and "Regression" in {e["name"] for e in experiments["experiments"]}
