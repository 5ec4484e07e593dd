"""The gate on object storage: ``nitro serve --storage s3://bucket/prefix`` takes run
directories under that prefix (every URL confined under it, as every path is under the
root), against real S3 servers (SeaweedFS and moto: tests/s3_server.py) and a real MCP client. A run
pushed to S3 validates and averages through the tools exactly as the same run on disk."""

from __future__ import annotations

import shutil
import uuid

import anyio
import boto3
import pytest
from mcp import Client

from nitro_core import Nitro, read_manifest
from nitro_core.examples.classifier import Classifier
from nitro_core.store import objects
from nitro_core.transfer import push
from nitro_mcp.server import build_server
from tests.s3_server import settings

from .conftest import FAST, call, ended, wait_done

BUCKET = "nitro-gate"


@pytest.fixture
def stored(s3_endpoint, tmp_path, monkeypatch):
    """A Classifier run trained on disk under the root (runs/Classifier) and pushed to
    ``s3://nitro-gate/<prefix>/runs/Classifier``; (root, storage URL, run URL)."""
    for k, v in settings(s3_endpoint).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    try:
        client.create_bucket(Bucket=BUCKET)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass  # an earlier test made it
    storage = f"s3://{BUCKET}/t-{uuid.uuid4().hex[:10]}"
    root = tmp_path / "root"
    Nitro(Classifier(**FAST), run_dir=root / "runs" / "Classifier").train()
    url = f"{storage}/runs/Classifier"
    push(root / "runs" / "Classifier", url)
    return root, storage, url


@pytest.fixture
def fetched(monkeypatch):
    """The keys this process downloads record bytes of (whole, or by sections): the gate
    reads headers alone; a job's worker, another process, reads what it needs."""
    keys: list[str] = []
    for name in ("download", "download_ranges"):
        real = getattr(objects.Bucket, name)

        def spy(self, key, *args, _real=real):
            keys.append(key)
            return _real(self, key, *args)

        monkeypatch.setattr(objects.Bucket, name, spy)
    return keys


def test_the_gate_validates_and_averages_an_s3_run_as_the_same_run_on_disk(stored, fetched):
    root, storage, url = stored
    listed = read_manifest(root / "runs" / "Classifier")

    async def go():
        async with Client(build_server(root, storage=storage)) as client:
            page = await call(client, "nitro_manifest", run_dir=url)
            validated = []
            averaged = []
            for run_dir, save in (
                ("runs/Classifier", "runs/avg.safetensors"),
                (url, f"{storage}/avg.safetensors"),
            ):
                v = await call(client, "nitro_validate", experiment="Classifier",
                               run_dir=run_dir, weights="latest => best", wait_s=60)  # fmt: skip
                validated.append(await ended(client, v, root))
                a = await call(client, "average", run_dir=run_dir, save=save, validate=True,
                               source="latest => Average(Last(2))", wait_s=60)  # fmt: skip
                averaged.append(await ended(client, a, root))
            best = validated[0][1]["checkpoint"].rsplit("/", 1)[-1]
            for weights in (f"{url}/{best}", f"s3://elsewhere/runs/Classifier/{best}"):
                v = await call(client, "nitro_validate", experiment="Classifier",
                               run_dir="runs/Classifier", weights=weights, wait_s=60)  # fmt: skip
                validated.append(await ended(client, v, root))
            again = await call(client, "average", run_dir=url, save=f"{storage}/avg.safetensors",
                               source="latest => Average(Last(2))")  # fmt: skip
            outside = [
                await call(client, "nitro_manifest", run_dir=text)
                for text in (f"{storage}x/runs/Classifier", "s3://elsewhere/runs/Classifier",
                             "gs://nitro-gate/runs/Classifier")
            ]  # fmt: skip
            to_url = await call(client, "nitro_export", source="latest => best", run_dir=url,
                              path=f"{storage}/w.safetensors")  # fmt: skip
            hf_url = await call(client, "nitro_validate", experiment="Classifier", run_dir=url,
                                weights=f"hf:{storage}/models/m")  # fmt: skip
            seeds = await call(client, "nitro_train", experiment="Classifier", run_dir=url,
                               seeds=[0, 1])  # fmt: skip
            save_outside = await call(client, "average", run_dir=url,
                                      source="latest => Average(Last(2))",
                                      save=f"s3://{BUCKET}/avg.safetensors")  # fmt: skip
        async with Client(build_server(root)) as client:
            unstored = await call(client, "nitro_manifest", run_dir=url)
            train_unstored = await call(client, "nitro_train", experiment="Classifier", run_dir=url)
        return (
            page,
            validated,
            averaged,
            again,
            outside,
            save_outside,
            unstored,
            train_unstored,
            to_url,
            hf_url,
            seeds,
        )

    replies = anyio.run(go)
    page, validated, averaged, again, outside, save_outside, unstored, train_unstored = replies[:8]
    to_url, hf_url, seeds = replies[8:]
    err, body = page
    assert not err, body
    assert body["run_dir"] == url and body["total"] == len(listed)
    assert [e["file"] for e in body["entries"]] == [e.file for e in listed]

    (e1, on_disk), (e2, on_s3), (e3, by_url), (e4, outside_weights) = validated
    assert not e1 and not e2 and not e3, (on_disk, on_s3, by_url)
    assert by_url["metrics"] == on_disk["metrics"]  # a local run, weights from S3 by URL
    assert e4 and "weights='s3://elsewhere/" in outside_weights, outside_weights
    assert "lies outside the server's storage" in outside_weights, outside_weights
    assert on_disk["state"] == on_s3["state"] == "succeeded", (on_disk, on_s3)
    assert on_s3["metrics"] == on_disk["metrics"]  # the same record, bit for bit
    assert on_s3["checkpoint"] == f"{url}/{on_disk['checkpoint'].rsplit('/', 1)[-1]}"

    (e1, avg_disk), (e2, avg_s3) = averaged
    assert not e1 and not e2, (avg_disk, avg_s3)
    assert avg_s3["state"] == "succeeded", avg_s3
    assert avg_s3["metrics"] == avg_disk["metrics"]
    assert avg_s3["averaged_from"]["files"] == avg_disk["averaged_from"]["files"]
    assert avg_s3["averaged_from"]["directory"] == url
    assert avg_s3["saved"] == f"{storage}/avg.safetensors"
    key = avg_s3["saved"].removeprefix(f"s3://{BUCKET}/")
    assert boto3.client("s3").head_object(Bucket=BUCKET, Key=key)["ContentLength"] > 0

    err, text = again
    assert err and "already exists; Nitro never overwrites an object" in text, text
    for err, text in outside[:2]:
        assert err and f"lies outside the server's storage '{storage}'" in text, text
        assert f"e.g. run_dir='{storage}/runs/Classifier'" in text, text
    err, text = outside[2]
    assert err and "gs:// is not a storage Nitro writes to" in text, text
    assert "s3://bucket/prefix" in text, text
    err, text = save_outside
    assert err and "save='s3://nitro-gate/avg.safetensors' lies outside" in text, text
    for err, text in (unstored, train_unstored):
        assert err and "is on object storage, which this server was not started with" in text
        assert "nitro serve --storage s3://bucket/prefix" in text, text
    err, text = hf_url
    assert err and "hf: takes a local Hugging Face model directory" in text, text
    err, text = seeds
    assert err and f"run_dir='{url}' is on object storage" in text, text
    assert "Send a local run_dir with seeds" in text, text
    err, text = to_url  # a path the tool writes on disk only: refused, never read as "s3:/..."
    assert err and "is a URL, and path takes a path here" in text, text
    assert not (root / "s3:").exists()  # a URL is never taken for a path under the root
    assert fetched == []  # the server checked each call by the records' headers alone


def test_a_record_on_s3_that_does_not_fit_is_refused_at_once_from_its_header(stored, fetched):
    root, storage, url = stored
    last = f"{url}/{read_manifest(url)[-1].file}"
    calls = [
        ("nitro_validate", {"experiment": "Regression", "run_dir": url, "weights": last}),
        ("nitro_train", {"experiment": "Regression", "run_dir": "runs/other", "weights": last,
                         "strict": False}),
        ("average", {"run_dir": url, "source": "latest => Average(Last(2))", "validate": True,
                     "experiment": "Regression"}),
        ("nitro_train", {"experiment": "Regression", "run_dir": f"{storage}/runs/new",
                         "weights": "latest => best", "strict": False}),
        ("nitro_train", {"experiment": "Regression", "run_dir": f"{storage}/runs/new",
                         "weights": last, "strict": False}),
    ]  # fmt: skip

    async def go():
        async with Client(build_server(root, storage=storage)) as client:
            return [await call(client, tool, **args) for tool, args in calls]

    replies = anyio.run(go)
    assert all(err for err, _ in replies), replies
    assert not (root / ".nitro" / "jobs").exists() or not any((root / ".nitro" / "jobs").iterdir())
    lacks = f"Checkpoint '{last}' does not fit Regression's model: the record lacks '2.weight'"
    size = f"Checkpoint '{last}' does not fit Regression's model: leaf '0.weight' has size [64, 16]"
    (_, validate), (_, train), (_, average), (_, nothing), (_, on_s3) = replies
    assert nothing.endswith(  # the run directory named by its URL, never its staging copy
        f"No checkpoint matches 'latest => best' in '{storage}/runs/new': it holds no checkpoints "
        "(no manifest entries). Train a run there first, or name a record file by its path."
    ), nothing
    assert size in on_s3 and f"run_dir='{storage}/runs/new'" in on_s3, on_s3
    assert lacks in validate and "send experiment='Classifier': nitro_validate(" in validate
    assert size in train and "send experiment='Classifier': nitro_train(" in train, train
    assert "does not fit Regression's model: the record lacks '2.weight'" in average, average
    assert f"{url}/" in average and "send experiment='Classifier': average(" in average
    assert fetched == []  # refused from the header: no record bytes were fetched


@pytest.mark.slow  # trains through a worker process on S3
def test_the_gate_trains_resumes_exports_and_deletes_on_s3(stored):
    root, storage, _ = stored
    url = f"{storage}/runs/fresh"

    async def go():
        async with Client(build_server(root, storage=storage)) as client:
            started = []
            for epochs in (2, 3):  # a new run, then resume="auto" continues it
                err, job = await call(client, "nitro_train", experiment="Classifier", run_dir=url,
                                      resume="auto", overrides={**FAST, "max_epochs": epochs})  # fmt: skip
                assert not err, job
                started.append(job)
                await wait_done(client, job["job_id"])
            first, more = [(False, await wait_done(client, job["job_id"])) for job in started]
            trained = [(e.run, e.epoch) for e in read_manifest(url)]
            export = await call(client, "nitro_export", source="latest => best",
                                path="exports/w.safetensors", run_dir=url)  # fmt: skip
            hf = root / "models" / "m"  # a Hugging Face directory: the exported state dict
            hf.mkdir(parents=True)
            shutil.copy(root / "exports" / "w.safetensors", hf / "model.safetensors")
            err, job = await call(client, "nitro_train", experiment="Classifier",
                                  run_dir=f"{storage}/runs/from-hf", weights="hf:models/m",
                                  overrides={**FAST, "max_epochs": 1})  # fmt: skip
            assert not err, job  # a local directory: no record header to read on S3
            from_hf = await wait_done(client, job["job_id"])
            dry = await call(client, "nitro_delete", run_dir=url)
            gone = await call(client, "nitro_delete", run_dir=url, dry_run=False)
            return first, more, trained, export, dry, gone, from_hf

    first, more, entries, export, dry, gone, from_hf = anyio.run(go)
    assert from_hf["state"] == "succeeded", from_hf
    assert [e.epoch for e in read_manifest(f"{storage}/runs/from-hf")] == [1]
    for _, status in (first, more):
        assert status["state"] == "succeeded", status
    assert more[1]["run_dir"] == url
    assert [epoch for _, epoch in entries] == [1, 2, 3]
    assert more[1]["result"]["kept_total"] == 3, more[1]["result"]  # read on S3
    assert len(more[1]["kept"]) == 3, more[1]  # nitro_status reads the S3 manifest too
    assert more[1]["result"]["epoch"] == 3
    assert len({run for run, _ in entries}) == 1  # the second job continued the first's run
    err, body = export
    assert not err and body["path"] == "exports/w.safetensors", body
    assert body["source_file"].startswith(f"{url}/"), body
    err, body = dry
    assert not err and body["dry_run"] and body["entries"] == 3, body
    err, body = gone
    assert not err and not body["dry_run"], body
    assert read_manifest(url) == []
