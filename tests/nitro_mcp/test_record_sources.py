"""Through the tools: a record directory (what an FSDP run writes) named by its path is a
source for nitro_validate, nitro_export and nitro_checkpoint_info; an average saved by the
``average`` tool carries its own validated metrics, never its state record's."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core import checkpoint_info, read_manifest
from nitro_mcp.server import build_server
from tests.nitro_core.record_dirs import to_record_directory

from .conftest import call, wait_done


def copied_root(trained_root, tmp_path: Path) -> Path:
    """A root of its own holding a copy of the session's trained runs/Classifier."""
    source, _ = trained_root
    root = tmp_path / "root"
    shutil.copytree(source / "runs" / "Classifier", root / "runs" / "Classifier")
    return root


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_a_record_directory_is_a_source_and_a_validated_average_keeps_its_metrics(
    trained_root, tmp_path
):
    # one server, so the second evaluation reuses the first one's warm worker
    root = copied_root(trained_root, tmp_path)
    run = root / "runs" / "Classifier"
    state = checkpoint_info(run / read_manifest(run)[-1].file)["metrics"]  # before rewriting
    directory = to_record_directory(run)
    named = f"runs/Classifier/{directory.name}"
    epoch = read_manifest(run)[-1].epoch

    async def main():
        async with Client(build_server(root)) as client:
            err, info = await call(client, "nitro_checkpoint_info", path=named)
            assert not err, info
            assert info["path"] == named and info["header"]["epoch"] == epoch
            err, export = await call(
                client, "nitro_export", source=f"{named}/", path="exports/w.safetensors"
            )
            assert not err, export
            assert export["source_file"] == named and export["epoch"] == epoch
            err, val = await call(client, "nitro_validate", experiment="Classifier",
                                  run_dir="runs/Classifier", weights=directory.name, wait_s=0)  # fmt: skip
            assert not err, val
            status = await wait_done(client, val["job_id"])
            assert status["state"] == "succeeded", status
            assert set(status["result"]["metrics"]) == {"acc", "loss"}
            assert status["result"]["checkpoint"].endswith(named)
            # an average validated and saved: its header holds its own metrics
            err, avg = await call(client, "average", run_dir="runs/Classifier",
                                  source="latest => Average(Last(2))", experiment="Classifier",
                                  validate=True, save="runs/Classifier/avg2.safetensors", wait_s=0)  # fmt: skip
            assert not err, avg
            status = await wait_done(client, avg["job_id"])
            assert status["state"] == "succeeded", status
            return status["result"]["metrics"]

    metrics = anyio.run(main)
    saved = checkpoint_info(run / "avg2.safetensors")["metrics"]
    assert saved == metrics and set(saved) == {"acc", "loss"}
    assert saved != state  # the average's own, not those of the record its state came from
    assert list((root / ".nitro" / "jobs").glob("*/average.safetensors")) == []
