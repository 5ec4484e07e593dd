"""A record names what its run started from as the run directory names it: on object storage
the record's URL, never the staging copy this machine read it from (issue 38). In-process
against a real S3 server (tests/s3_server.py)."""

from __future__ import annotations

import uuid

import boto3
import pytest

from nitro_core import Nitro, checkpoint_info, read_manifest
from tests.nitro_core.tiny import Tiny
from tests.s3_server import settings

BUCKET = "nitro-loaded-from"


@pytest.fixture
def storage(s3_endpoint, monkeypatch, tmp_path):
    """A fresh prefix on the server, and the staging directory the handles read through."""
    for k, v in settings(s3_endpoint).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    staging = tmp_path / "staging"
    monkeypatch.setenv("NITRO_STAGING", str(staging))
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass  # an earlier test made it
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:10]}", staging


def test_a_record_names_the_url_it_resumed_or_took_weights_from_never_the_staging_copy(
    storage, tmp_path
):
    prefix, staging = storage
    url = f"{prefix}/run"
    Nitro(Tiny(max_epochs=1), run_dir=url).train().close()
    first = read_manifest(url)[0].file
    resumed = Nitro(Tiny(max_epochs=2), run_dir=url, resume="auto")
    assert resumed.checkpoint_source == f"{url}/{first}"
    resumed.train().close()
    branched = {}
    for where in (f"{prefix}/other", tmp_path / "local"):  # weights by URL, into S3 and a disk
        n = Nitro(Tiny(max_epochs=1), run_dir=where, weights=f"{url}/{first}").train()
        n.close()
        branched[str(where)] = checkpoint_info(f"{where}/{read_manifest(where)[-1].file}")
    second = checkpoint_info(f"{url}/{read_manifest(url)[-1].file}")
    assert staging.is_dir()  # the records were read through it
    assert second["loaded_from"] == f"{url}/{first}", second["loaded_from"]
    for header in branched.values():
        assert header["loaded_from"] == f"{url}/{first}", header["loaded_from"]
        assert header["parent"] == f"{read_manifest(url)[0].run}/{first}", header["parent"]
