"""What the object-store finalizer (nitro_core.store.object_run) deletes and when, in-process
against a real S3 server: a record directory goes ``header.json`` first, so a deletion that
fails midway leaves no whole-looking record; an upload whose commit failed is deleted only
when a manifest read says it is unlisted, never when the outcome is unknown; and a record
is "listed already" only under another name with the same run *and* digest (a push run
again), never merely by its run."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest

from nitro_core.errors import ObjectStoreError
from nitro_core.store import object_run, objects
from nitro_core.store.manifest import ManifestEntry
from tests.s3_server import client_for

BUCKET = "nitro-object-run"
SHARDS = [f"shard-0000{r}-model-00001-of-00001.safetensors" for r in (1, 2)]


@pytest.fixture
def run(s3_endpoint, monkeypatch):
    """A run directory under a fresh prefix, and a client of the server."""
    client = client_for(s3_endpoint, monkeypatch, BUCKET)
    return client, objects.parse(f"s3://{BUCKET}/t-{uuid.uuid4().hex[:10]}/run")


def _entry(file: str, digest: int, run_id: str = "r1", step: int = 1) -> ManifestEntry:
    return ManifestEntry(
        file=file, epoch=step, step=step, score=None, metric=None, mode=None, stop_reason=None,
        run=run_id, written="2026-01-01T00:00:00Z", bytes=1, digest=f"xxh3-128-tree:{digest:032x}",
    )  # fmt: skip


def _sent(client, run, name: str) -> None:
    """A record object sent whole under ``name``, not yet listed."""
    client.put_object(Bucket=BUCKET, Key=run.child(name).key, Body=b"record")


def _keys(client, run) -> set[str]:
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=run.key + "/").get("Contents", ())
    return {o["Key"].removeprefix(run.key + "/") for o in listed}


def _listed(run) -> list[tuple[str, str]]:
    return [(e.file, e.run) for e in object_run.read_manifest(run)]


@dataclass(frozen=True)
class _Plan:
    entries: tuple[ManifestEntry, ...]
    runs: tuple[str, ...] = ()


def test_a_record_directory_goes_header_first_so_a_failed_deletion_leaves_no_record(
    run, monkeypatch
):
    client, url = run
    for name in (".claim", "header.json", *SHARDS):
        _sent(client, url, f"rec-1/{name}")
    entry = _entry("rec-1", 1)
    assert object_run.list_entry(url, entry, None) == entry
    deleted: list[str] = []
    real = objects.Bucket.delete

    def delete(self, key):  # the store deletes one object, then fails
        if deleted:
            raise ObjectStoreError(f"the store failed deleting {key}")
        deleted.append(key.removeprefix(url.key + "/"))
        real(self, key)

    monkeypatch.setattr(objects.Bucket, "delete", delete)
    plan, removed = object_run.remove(url, lambda manifest: _Plan((entry,)), dry_run=False)
    assert deleted == ["rec-1/header.json"]
    assert (removed.files, removed.skipped) == ((), ("rec-1",))  # left: unlisted, never read
    assert _keys(client, url) == {"manifest.json", "rec-1/.claim", *(f"rec-1/{s}" for s in SHARDS)}
    assert _listed(url) == []  # unlisted before any object went


@pytest.mark.parametrize(
    ("manifest_says", "kept"),
    [
        ("unreadable", True),  # the outcome is unknown: the upload may be listed, keep it
        ("lists it", True),  # the replace was applied, only its answer was lost
        ("does not list it", False),  # the commit never happened: the upload goes
    ],
)
def test_an_upload_whose_commit_failed_is_deleted_only_when_the_manifest_says_unlisted(
    run, monkeypatch, manifest_says, kept
):
    client, url = run
    _sent(client, url, "a.safetensors")
    entry = _entry("a.safetensors", 1)
    read = object_run.read_manifest
    if manifest_says == "lists it":
        object_run.list_entry(url, entry, None)

    def lost(run, change):
        raise ObjectStoreError("the connection dropped before the store answered")

    def unreadable(run):
        if manifest_says == "unreadable":
            raise ObjectStoreError("the store does not answer")
        return read(run)

    monkeypatch.setattr(object_run, "commit", lost)
    monkeypatch.setattr(object_run, "read_manifest", unreadable)
    with pytest.raises(ObjectStoreError, match="the connection dropped"):
        object_run.list_entry(url, entry, None)
    assert ("a.safetensors" in _keys(client, url)) is kept


def test_a_record_is_listed_already_only_by_the_same_run_and_digest_under_another_name(run):
    client, url = run
    for name in ("a.safetensors", "b.safetensors", "a-again.safetensors", "c.safetensors"):
        _sent(client, url, name)
    first = _entry("a.safetensors", 1)
    assert object_run.list_entry(url, first, None) == first
    other = _entry("b.safetensors", 2, step=2)  # the same run, another record: listed
    assert object_run.list_entry(url, other, None) == other
    again = _entry("a-again.safetensors", 1)  # a push run again: the same run and digest
    assert object_run.list_entry(url, again, None) == first  # the entry listed, not a second
    theirs = _entry("c.safetensors", 1, run_id="r2")  # another run's record: listed
    assert object_run.list_entry(url, theirs, None) == theirs
    assert _listed(url) == [
        ("a.safetensors", "r1"),
        ("b.safetensors", "r1"),
        ("c.safetensors", "r2"),
    ]
    assert "a-again.safetensors" not in _keys(client, url)  # the redundant copy is deleted
    copied = _entry("a-copy.safetensors", 1)
    _sent(client, url, "a-copy.safetensors")
    assert object_run.list_entry(url, copied, None, copy=True) is None  # a copy lists nothing
