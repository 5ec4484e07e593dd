"""Jobs written before the call models keep reading: a server over a root holding them
(``fixtures/old_jobs/store``, written by the code of commit dc2c484 with its ``generate.py``: a
flat ``spec.json``) lists them, reports their status, proposes the calls that code proposed
for them, and launches the one still queued. Jobs survive a server restart, and an upgrade
is one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core.jobs.files import JobSpec, job_dir, read_spec
from nitro_core.store.manifest import read_manifest
from nitro_mcp.server import build_server
from nitro_mcp.tool_calls import resume_call, same_call

from .conftest import call, wait_done

FIXTURE = Path(__file__).parent / "fixtures" / "old_jobs"
OLD_ROOT = "/tmp/nitro-old-root"  # where generate.py wrote them
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


@pytest.fixture
def old_root(tmp_path) -> Path:
    """A root holding a copy of the fixture's job store (``store/``, the ``.nitro`` of the
    root it was written in), its absolute paths moved from OLD_ROOT to this root."""
    root = tmp_path / "root"
    shutil.copytree(FIXTURE / "store", root / ".nitro")
    for path in (root / ".nitro").rglob("*"):
        if path.is_file():
            path.write_text(path.read_text().replace(OLD_ROOT, str(root)))
    return root


def test_old_specs_read_as_the_call_of_their_kind(old_root):
    flat = json.loads(
        (job_dir(old_root, EXPECTED["stopped_train"]["job_id"]) / "spec.json").read_text()
    )
    assert "call" not in flat and flat["seed"] == 3  # the fixture is of the flat format
    for name, expected in EXPECTED.items():
        spec = read_spec(job_dir(old_root, expected["job_id"]))
        assert (spec.kind, spec.call.kind) == (expected["kind"], expected["kind"]), name
        assert same_call(spec, old_root) == expected["same_call"], name  # as the old code wrote it
        if spec.kind == "train":
            assert resume_call(spec, old_root) == expected["resume_call"], name
    train = read_spec(job_dir(old_root, EXPECTED["stopped_train"]["job_id"])).call
    assert (train.seed, train.device, train.logger, train.restore_best) == (
        3,
        "cpu",
        "jsonl",
        "true",
    )
    # a field its kind never takes, at a value the old server never wrote: refused by name
    validate = json.loads(
        (job_dir(old_root, EXPECTED["lost_validate"]["job_id"]) / "spec.json").read_text()
    )
    JobSpec.model_validate(validate)
    with pytest.raises(ValueError, match=r"nproc\n  Extra inputs are not permitted"):
        JobSpec.model_validate({**validate, "nproc": 4})


def test_a_server_over_old_jobs_lists_them_and_proposes_the_calls_it_did(old_root):
    async def main():
        async with Client(build_server(old_root, max_jobs=0)) as client:
            err, page = await call(client, "nitro_jobs")
            assert not err, page
            listed = {job["job_id"]: job["kind"] for job in page["jobs"]}
            assert listed == {e["job_id"]: e["kind"] for e in EXPECTED.values()}
            for name in ("stopped_train", "lost_validate", "stopped_average"):
                expected = EXPECTED[name]
                err, status = await call(client, "nitro_status", job_id=expected["job_id"])
                assert not err, status
                assert status["state"] == name.split("_")[0], name
                assert status["hint"] == expected["hint"], name
            err, status = await call(
                client, "nitro_status", job_id=EXPECTED["queued_train"]["job_id"]
            )
            assert not err and status["state"] == "queued", status

    anyio.run(main)


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_a_queued_old_job_launches_and_trains(old_root):
    queued = EXPECTED["queued_train"]

    async def main():
        async with Client(build_server(old_root, max_jobs=1)) as client:
            return await wait_done(client, queued["job_id"])

    status = anyio.run(main)
    assert status["state"] == "succeeded", status
    entries = read_manifest(old_root / "runs" / "queued")
    assert [e.epoch for e in entries] == [1]
