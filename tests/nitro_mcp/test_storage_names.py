"""The gate's replies about records on object storage name them by their URLs, never by the
staging directory the server or a worker read them through (``NITRO_STAGING``); and the
record tools take those URLs as the CLI does (``nitro verify s3://...``, ``nitro info
s3://...``), under the server's ``--storage``. Against a real SeaweedFS server
(tests/s3_server.py) and a real MCP client."""

from __future__ import annotations

import json

import anyio
import boto3
import pytest
from mcp import Client

from nitro_core import checkpoint_info, read_manifest
from nitro_core.store import objects
from nitro_mcp.server import build_server

from . import test_storage_tools
from .conftest import call, ended, wait_done

BUCKET = test_storage_tools.BUCKET
stored = test_storage_tools.stored  # the fixture: a Classifier run pushed under the storage

TINY = {"max_epochs": 1, "samples": 64}
# the reply's words, not the server's S3: on SeaweedFS alone (the store's tests run on moto too)
pytestmark = pytest.mark.parametrize("s3_endpoint", ["seaweedfs"], indirect=True)


def test_replies_and_refusals_of_s3_calls_name_urls_never_the_staging_directory(stored, tmp_path):
    root, storage, url = stored
    listed = read_manifest(url)
    last = f"{url}/{listed[-1].file}"
    calls = [
        ("nitro_validate", {"experiment": "Classifier", "run_dir": "runs/Classifier",
                            "weights": last, "wait_s": 60}),
        ("nitro_validate", {"experiment": "Classifier", "run_dir": url, "wait_s": 60}),
        ("average", {"run_dir": url, "source": "latest => Average(Last(2))", "validate": True,
                     "wait_s": 60}),
        ("nitro_train", {"experiment": "Classifier", "run_dir": "runs/from-s3", "weights": last,
                         "overrides": TINY}),
        ("nitro_export", {"run_dir": url, "source": "latest => best",
                          "path": "exports/w.safetensors"}),
        ("nitro_checkpoint_info", {"path": last}),
        ("nitro_validate", {"experiment": "Classifier", "run_dir": url,
                            "weights": f"{url}/nothing.safetensors"}),
        ("nitro_checkpoint_info", {"path": f"{url}/nothing.safetensors"}),
    ]  # fmt: skip

    async def go():
        replies, statuses = [], []
        async with Client(build_server(root, storage=storage)) as client:
            for tool, args in calls:
                reply = await call(client, tool, **args)
                if tool in ("nitro_validate", "average"):
                    reply = await ended(client, reply, root)
                replies.append(reply)
                err, body = reply
                if not err and "job_id" in body:
                    statuses.append(await wait_done(client, body["job_id"]))
        return replies, statuses

    replies, statuses = anyio.run(go)
    staging = str(tmp_path / "staging")
    assert (tmp_path / "staging").is_dir()  # the server and its workers read through it
    said = json.dumps([replies, statuses])
    assert staging not in said and "/.cache/nitro/staging" not in said, said[:4000]
    by_url, on_s3, averaged, trained, exported, info, no_record, no_info = replies
    for err, body in (by_url, on_s3, averaged, trained, exported, info):
        assert not err, body
    assert by_url[1]["checkpoint"] == last, by_url  # a local run_dir, weights by URL
    assert on_s3[1]["checkpoint"].startswith(f"{url}/"), on_s3
    assert averaged[1]["averaged_from"]["directory"] == url, averaged
    train = next(s for s in statuses if s["kind"] == "train")
    assert train["state"] == "succeeded", train
    assert train["result"]["checkpoint_source"] == last, train["result"]
    header = checkpoint_info(
        root / "runs" / "from-s3" / read_manifest(root / "runs/from-s3")[0].file
    )
    assert header["loaded_from"] == last, header["loaded_from"]  # issue 38
    assert exported[1]["source_file"].startswith(f"{url}/"), exported
    assert info[1]["path"] == last and info[1]["header"]["epoch"] == listed[-1].epoch, info
    err, text = no_record
    assert err and text.endswith(
        f"'{url}/nothing.safetensors' is not a record the manifest of '{url}' lists (an object "
        "there that the manifest does not list is an upload whose commit never happened, and is "
        f"never read). Listed: {', '.join(repr(e.file) for e in listed)}. nitro_manifest lists "
        "them."
    ), text
    err, text = no_info
    assert err and f"'{url}/nothing.safetensors' is not a record the manifest" in text, text


def test_nitro_verify_takes_an_s3_run_directory_or_record_under_the_storage(stored):
    root, storage, url = stored
    listed = read_manifest(url)
    damaged = listed[0].file  # its bytes replaced by others of the same length
    client = boto3.client("s3")  # the server the fixture's settings name
    key = objects.parse(f"{url}/{damaged}").key

    async def go(paths):
        async with Client(build_server(root, storage=storage)) as client:
            return [await call(client, "nitro_verify", path=p) for p in paths]

    whole, one = anyio.run(go, [url, f"{url}/{listed[-1].file}"])
    for err, body in (whole, one):
        assert not err and body["ok"], body
    assert whole[1]["path"] == url and whole[1]["checked"] == len(listed), whole
    assert one[1]["path"] == f"{url}/{listed[-1].file}" and one[1]["checked"] == 1, one
    data = bytearray(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    data[-1] ^= 0xFF  # the last tensor byte flipped
    client.put_object(Bucket=BUCKET, Key=key, Body=bytes(data))
    (err, body), outside, unstored = anyio.run(
        go, [url, "s3://elsewhere/runs/Classifier", f"{storage}x/runs/Classifier"]
    )
    assert not err and not body["ok"] and body["checked"] == len(listed), body
    assert [p["file"] for p in body["problems"]] == [damaged], body
    err, text = outside
    assert err and "path='s3://elsewhere/runs/Classifier' lies outside the server's storage" in text
    assert f"e.g. path='{storage}/runs/Classifier'" in text, text
    err, text = unstored
    assert err and f"path='{storage}x/runs/Classifier' lies outside" in text, text


def test_a_server_without_storage_refuses_nitro_verify_of_a_url(stored):
    root, _, url = stored

    async def go():
        async with Client(build_server(root)) as client:
            return await call(client, "nitro_verify", path=url)

    err, text = anyio.run(go)
    assert err and text.endswith(
        f"path='{url}' is on object storage, which this server was not started with; give a "
        "path inside the server's root, e.g. path='runs/Classifier/weights.safetensors', or "
        "start the server with nitro serve --storage s3://bucket/prefix to allow URLs under "
        "that prefix."
    ), text
