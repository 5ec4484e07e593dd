"""The gate refuses an average whose save path already exists at the call, before any job
starts, and the file stays as it was."""

from __future__ import annotations

import anyio
from mcp import Client

from nitro_mcp.server import build_server

from .conftest import call


def test_average_refuses_an_existing_save_path_at_the_call(tmp_path):
    (tmp_path / "runs").mkdir()
    taken = tmp_path / "runs" / "taken.safetensors"
    taken.write_bytes(b"someone's file")

    async def main():
        async with Client(build_server(tmp_path, max_jobs=0)) as client:
            return await call(
                client, "average", run_dir="runs", source="latest => Average(Last(2))",
                save="runs/taken.safetensors",
            )  # fmt: skip

    err, text = anyio.run(main)
    assert err, text
    assert text == (
        "Error executing tool average: save='runs/taken.safetensors' already exists; Nitro never "
        "overwrites it. Choose a new name."
    )
    assert taken.read_bytes() == b"someone's file"
    assert not (tmp_path / ".nitro" / "jobs").exists() or not list(
        (tmp_path / ".nitro" / "jobs").iterdir()
    )
