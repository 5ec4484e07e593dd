"""A record written on its own to object storage (an average's ``save=``, an export) is a
source like the same file on a disk: read as ``weights=``, by ``checkpoint_info`` and by
``verify``, checked against its own digests. An unlisted object beside a run directory's
manifest (an upload whose commit never happened) is still refused. A real S3 server."""

from __future__ import annotations

import uuid

import pytest
import torch

from nitro_core import (
    CheckpointCorrupt,
    CheckpointMissing,
    Nitro,
    average_checkpoints,
    checkpoint_info,
    export_weights,
    verify,
)
from nitro_core.examples import Regression
from tests.s3_server import client_for

EXP = Regression(max_epochs=3, samples=64)


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path):
    client = client_for(s3_endpoint, monkeypatch, "nitro-standalone")
    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    return client, f"s3://nitro-standalone/t-{uuid.uuid4().hex[:10]}"


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_average_saved_to_s3_is_read_back_as_weights_info_and_verify(s3):
    client, base = s3
    run = f"{base}/runs/r"
    Nitro(EXP, run_dir=run).train().close()
    saved = f"{base}/avg/last2.safetensors"
    avg = average_checkpoints(run, "latest => Average(Last(2))", save=saved)
    n = Nitro(EXP, run_dir="runs/x", weights=saved)
    assert _same(n.model.state_dict(), avg.state)
    assert str(n.checkpoint_source) == saved  # the URL, never the staging copy
    info = checkpoint_info(saved)
    assert info["averaged_from"]["files"] == avg.averaged_from["files"]
    (checked,) = verify(saved)
    assert (checked.file, checked.listed, checked.ok, checked.sections) == (
        "last2.safetensors", False, True, ["params"],
    )  # fmt: skip
    exported = f"{base}/export/w.safetensors"
    export_weights(n, exported)
    assert _same(Nitro(EXP, run_dir="runs/y", weights=exported).model.state_dict(), avg.state)


def test_a_standalone_object_changed_after_its_write_is_refused_by_its_own_digests(s3):
    client, base = s3
    run = f"{base}/runs/r"
    Nitro(EXP, run_dir=run).train().close()
    saved = f"{base}/avg/a.safetensors"
    average_checkpoints(run, "latest => Average(Last(2))", save=saved)
    bucket, key = saved.removeprefix("s3://").split("/", 1)
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[-3] ^= 0x01  # a byte of the params section
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    with pytest.raises(CheckpointCorrupt, match="params"):
        Nitro(EXP, run_dir="runs/x", weights=saved)
    (checked,) = verify(saved)
    assert not checked.ok and saved in checked.problem and "staging" not in checked.problem


def test_an_unlisted_object_beside_a_manifest_is_still_refused(s3):
    client, base = s3
    run = f"{base}/runs/r"
    Nitro(EXP, run_dir=run).train().close()
    bucket, prefix = run.removeprefix("s3://").split("/", 1)
    (last,) = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/epoch-0003")["Contents"]
    stray = f"{prefix}/epoch-0009-step-9.safetensors"  # a whole record the manifest never listed
    client.copy_object(Bucket=bucket, Key=stray, CopySource={"Bucket": bucket, "Key": last["Key"]})
    with pytest.raises(CheckpointMissing, match="an upload whose commit never happened"):
        Nitro(EXP, run_dir="runs/x", weights=f"{run}/epoch-0009-step-9.safetensors")
    with pytest.raises(CheckpointMissing, match="an upload whose commit never happened"):
        checkpoint_info(f"{run}/epoch-0009-step-9.safetensors")


def test_no_object_at_a_standalone_url_says_what_to_name(s3):
    _, base = s3
    with pytest.raises(CheckpointMissing) as raised:
        Nitro(EXP, run_dir="runs/x", weights=f"{base}/avg/none.safetensors")
    assert str(raised.value) == (
        f"No record at '{base}/avg/none.safetensors': no object has that name. Name a record "
        "by its URL (e.g. s3://bucket/avg/last2.safetensors), or a run directory's record by "
        "its source, e.g. 'latest => best' with run_dir=s3://bucket/runs/a."
    )
