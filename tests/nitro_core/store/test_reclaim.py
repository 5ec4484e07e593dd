"""Reclaim (issue 34, items 6 and 7; the run store's ``reclaim()``): what a kill leaves that no
manifest lists is removed by the run's next write or resume, on a disk and on a real S3
server, once older than ``NITRO_RECLAIM_AFTER_S``; what is the user's (an average or an export
saved into the run directory, a file of another name) or may be a live writer's stays."""

from __future__ import annotations

import fcntl
import os
import shutil
import uuid
import warnings

import pytest

from nitro_core import (
    ConfigError,
    Nitro,
    NitroWarning,
    average_checkpoints,
    export_weights,
    read_manifest,
    verify,
)
from nitro_core.store import claims, manifest
from nitro_core.store.reclaim import AGE_VARIABLE, age_s, record_like
from nitro_core.store.run import open_run
from tests.s3_server import client_for

from ..tiny import KeepLast


def _dropped_but_not_unlinked(run) -> str:
    """What a kill between retention's manifest commit and its unlink leaves: the oldest
    listed record, dropped from the manifest, still on disk."""
    oldest = read_manifest(run)[0].file
    with claims.manifest_lock(run):
        manifest.commit(run, drop=[oldest])
    assert (run / oldest).exists() and oldest not in {e.file for e in read_manifest(run)}
    return oldest


def test_a_record_retention_dropped_but_never_unlinked_is_reclaimed_by_the_next_run(
    tmp_path, monkeypatch
):
    run = tmp_path / "run"
    Nitro(KeepLast(max_epochs=2), run_dir=run).train().close()
    left = _dropped_but_not_unlinked(run)
    average_checkpoints(
        run, "latest => Average(Last(1))", save=run / "epoch-0001-step-9-avg.safetensors"
    )
    n = Nitro(KeepLast(max_epochs=3), run_dir=run, resume="auto")
    export_weights(n, run / "epoch-0002-step-8-export.safetensors")
    (run / "notes-epoch-x.txt").write_text("mine")
    young = n.store.reclaim(dry_run=True)
    assert young == []  # younger than the default hour: a live writer's, for all we know
    monkeypatch.setenv(AGE_VARIABLE, "0")
    (would,) = n.store.reclaim(dry_run=True)
    assert would.name == left and would.bytes > 0 and (run / left).exists()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        n.train()
    said = [str(w.message) for w in seen if issubclass(w.category, NitroWarning)]
    assert any(f"removed 1 record(s) no manifest lists, left by killed writes ({left!r})" in s
               for s in said), said  # fmt: skip
    assert not (run / left).exists()
    for kept in ("epoch-0001-step-9-avg.safetensors", "epoch-0002-step-8-export.safetensors",
                 "notes-epoch-x.txt"):  # fmt: skip
        assert (run / kept).exists(), kept  # the user's: an average, an export, another name
    n.close()


def test_a_file_a_live_writer_holds_is_never_reclaimed(tmp_path, monkeypatch):
    run = tmp_path / "run"
    Nitro(KeepLast(max_epochs=2), run_dir=run).train().close()
    left = _dropped_but_not_unlinked(run)
    monkeypatch.setenv(AGE_VARIABLE, "0")
    fd = claims.open_lock(run / left, os.O_RDONLY)  # the lock a write in flight holds on it
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert open_run(run).reclaim() == [] and (run / left).exists()
    finally:
        claims.close_lock(fd)
    assert [x.name for x in open_run(run).reclaim()] == [left]
    assert not (run / left).exists()


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_reclaim_age_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(AGE_VARIABLE, value)
    with pytest.raises(ConfigError) as raised:
        age_s()
    assert str(raised.value) == (
        f"{AGE_VARIABLE}={value!r} is not a number of seconds; set it to how old an unlisted "
        f"record must be before it is reclaimed, e.g. {AGE_VARIABLE}=3600, or unset it."
    )


def test_record_names_are_the_writer_s_alone():
    assert record_like("epoch-0003-step-120-loss=0.0416831.safetensors")
    assert record_like("exp-epoch-0003-batch-0002-step-9.safetensors")
    assert record_like("epoch-0001-step-4-run-r1-1")  # a record directory's spare name
    for other in ("avg.safetensors", "manifest.json", "logs",
                  "epoch-0003-step-1.safetensors.tmp", "epoch-0003-step-1.safetensors.stale2"):  # fmt: skip
        assert not record_like(other), other


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path):
    client = client_for(s3_endpoint, monkeypatch, "nitro-reclaim")
    monkeypatch.setenv("NITRO_STAGING", str(tmp_path / "staging"))
    prefix = f"t-{uuid.uuid4().hex[:10]}/run"
    return client, "nitro-reclaim", prefix


def test_a_killed_upload_and_an_open_multipart_upload_on_s3_are_reclaimed(s3, monkeypatch):
    client, bucket, prefix = s3
    url = f"s3://{bucket}/{prefix}"
    Nitro(KeepLast(max_epochs=2), run_dir=url).train().close()
    last = read_manifest(url)[-1].file
    # what a SIGKILL between an upload and its manifest commit leaves: a whole, unlisted record
    stray = "epoch-0003-step-12-loss=0.5.safetensors"
    client.copy_object(Bucket=bucket, Key=f"{prefix}/{stray}",
                       CopySource={"Bucket": bucket, "Key": f"{prefix}/{last}"})  # fmt: skip
    # ...and a killed multipart upload of a large record: parts, never completed
    up = client.create_multipart_upload(
        Bucket=bucket, Key=f"{prefix}/epoch-0004-step-16.safetensors"
    )
    client.upload_part(Bucket=bucket, Key=f"{prefix}/epoch-0004-step-16.safetensors",
                       UploadId=up["UploadId"], PartNumber=1, Body=b"x" * 1024)  # fmt: skip
    client.put_object(Bucket=bucket, Key=f"{prefix}/README.txt", Body=b"mine")
    assert open_run(url).reclaim(dry_run=True) == []  # younger than an hour: kept
    monkeypatch.setenv(AGE_VARIABLE, "0")
    problems = {c.file: c.problem for c in verify(url) if not c.ok}
    assert set(problems) == {stray, "epoch-0004-step-16.safetensors"}, problems
    assert "a record no manifest lists, left by a killed write" in problems[stray]
    assert "an open multipart upload that no writer completed" in problems[
        "epoch-0004-step-16.safetensors"]  # fmt: skip
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        Nitro(KeepLast(max_epochs=3), run_dir=url, resume="auto").train().close()
    said = " ".join(str(w.message) for w in seen if issubclass(w.category, NitroWarning))
    assert f"left by killed writes ({stray!r})" in said and "aborted 1 multipart upload" in said
    keys = {o["Key"].split("/")[-1] for o in client.list_objects_v2(
        Bucket=bucket, Prefix=prefix + "/")["Contents"]}  # fmt: skip
    assert stray not in keys and "README.txt" in keys
    assert not client.list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/").get("Uploads")
    assert all(c.ok for c in verify(url))


def test_a_record_directory_upload_killed_before_its_header_is_reclaimed_on_s3(s3, monkeypatch):
    client, bucket, prefix = s3
    url = f"s3://{bucket}/{prefix}"
    Nitro(KeepLast(max_epochs=1), run_dir=url).train().close()
    for rank in (0, 1):  # shards sent, header.json never: the record was never sealed
        client.put_object(Bucket=bucket, Key=f"{prefix}/epoch-0002-step-8/{rank}.safetensors",
                          Body=b"shard")  # fmt: skip
    monkeypatch.setenv(AGE_VARIABLE, "0")
    (gone,) = open_run(url).reclaim()
    assert (gone.name, gone.bytes) == ("epoch-0002-step-8", 10)
    assert not client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/epoch-0002").get("Contents")


def test_reclaim_on_a_disk_never_follows_a_link(tmp_path, monkeypatch):
    run = tmp_path / "run"
    Nitro(KeepLast(max_epochs=2), run_dir=run).train().close()
    outside = tmp_path / "outside.safetensors"
    shutil.copy(run / read_manifest(run)[-1].file, outside)
    (run / "epoch-0009-step-99.safetensors").symlink_to(outside)
    monkeypatch.setenv(AGE_VARIABLE, "0")
    open_run(run).reclaim()
    assert outside.exists()  # the link's target is never touched


def test_a_run_killed_before_its_first_commit_on_s3_leaves_nothing_once_resumed(s3, monkeypatch):
    """No manifest names the killed run (its first commit never happened), so the record it
    uploaded is claimed by no run the directory knows: on object storage, where an unlisted
    object is never read, it is still a leftover; an average saved beside it stays."""
    client, bucket, prefix = s3
    other = f"s3://{bucket}/{prefix}-other"
    Nitro(KeepLast(max_epochs=1), run_dir=other).train().close()
    (only,) = read_manifest(other)
    url = f"s3://{bucket}/{prefix}"  # a fresh run directory: no manifest yet
    client.copy_object(Bucket=bucket, Key=f"{prefix}/{only.file}",
                       CopySource={"Bucket": bucket, "Key": f"{prefix}-other/{only.file}"})  # fmt: skip
    average_checkpoints(other, "latest => Average(Last(1))",
                        save=f"{url}/epoch-0001-step-4-avg.safetensors")  # fmt: skip
    monkeypatch.setenv(AGE_VARIABLE, "0")
    Nitro(KeepLast(max_epochs=1), run_dir=url, resume="auto").train().close()
    keys = {o["Key"].split("/")[-1] for o in client.list_objects_v2(
        Bucket=bucket, Prefix=prefix + "/")["Contents"]}  # fmt: skip
    listed = {e.file for e in read_manifest(url)}
    assert keys == listed | {"manifest.json", "epoch-0001-step-4-avg.safetensors"}, keys
