"""A run directory on object storage (``s3://bucket/prefix/run``): the commit protocol's
object-store finalizer.

The manifest object (``<run>/manifest.json``, the same document as on a disk, always
complete) is the only commit point. A record is one object, uploaded whole under a name no
object had (``If-None-Match: *``: a partial upload is never visible, an existing object is
never overwritten), and counts once a manifest replace lists it. A replace is conditional
(``If-Match`` the ETag read; ``If-None-Match: *`` for the first): a writer that lost the race
re-reads the manifest, decides its change again (retention included) and retries, so two
processes writing one run directory lose nothing and list nothing twice; no lock is taken.
An object the manifest does not list (an upload whose commit never happened) is never read
as a record; retention deletes an object only after a committed manifest stopped listing it.
Reads check the manifest's digest of the record (the header) and every section's digest,
exactly as on a disk.
"""

from __future__ import annotations

import json
import os
import random
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from nitro_core.errors import (
    CheckpointCorrupt,
    CheckpointMissing,
    ConfigError,
    Lister,
    ObjectStoreError,
)
from nitro_core.store import record_header
from nitro_core.store.manifest import Manifest, ManifestEntry, Point, parse_manifest
from nitro_core.store.manifest_file import MANIFEST_NAME
from nitro_core.store.objects import Bucket, ObjectUrl, bucket

T = TypeVar("T")
ATTEMPTS = 100  # conditional replaces tried before a contended manifest is given up
_FIRST = 64 * 1024  # bytes of a record read first: the header, mostly, in one request


@dataclass
class Listed:
    """A run directory's manifest and the ETag of the object it was read from (None: the
    run directory has no manifest yet)."""

    manifest: Manifest
    etag: str | None


def load(run: ObjectUrl) -> Listed:
    got = bucket(run).get(run.child(MANIFEST_NAME).key)
    if got is None:
        return Listed(Manifest(), None)
    shown = run.child(MANIFEST_NAME).shown()
    state = parse_manifest(Path(shown), got.body)
    if state.journal_id is not None:
        raise CheckpointCorrupt(
            f"Manifest {str(shown)!r} says a manifest.journal continues it, which object "
            "storage never holds: it was copied from a disk in the middle of a journal. Copy "
            "the run directory with `nitro push` instead, which commits each record."
        )
    return Listed(state, got.etag)


def read_manifest(run: ObjectUrl) -> list[ManifestEntry]:
    return list(load(run).manifest.entries)


def staging(run: ObjectUrl) -> Path:
    """The local directory a handle training ``run`` works in: its records are written
    there and uploaded, its logs stay there, a resumed record is copied down there.
    ``NITRO_STAGING`` (default ``~/.cache/nitro/staging``), then the bucket and the key."""
    root = Path(os.environ.get("NITRO_STAGING") or Path.home() / ".cache" / "nitro" / "staging")
    return root.expanduser() / run.bucket / run.key


def fetch_entry(storage: ObjectUrl, entry: ManifestEntry, into: Path) -> Path:
    """A fresh local copy of the listed record ``entry`` in ``into`` (its readers check it
    against the manifest's digest as they read)."""
    return fetch(storage.child(entry.file), into)


def commit(run: ObjectUrl, change: Callable[[Manifest], T]) -> T:
    """Apply ``change`` to the current manifest and replace it conditionally; on a lost race
    read it again and apply ``change`` to that (so it must decide from what it is given, not
    from what it saw before). Returns what ``change`` returned for the manifest committed."""
    store, key = bucket(run), run.child(MANIFEST_NAME).key
    for attempt in range(ATTEMPTS):
        listed = load(run)
        state = listed.manifest.copy_out()
        result = change(state)
        body = state.to_json()
        if listed.etag is None:
            done = store.create(key, body)
        else:
            done = store.replace(key, body, listed.etag)
        if done is not None:
            return result
        time.sleep(random.uniform(0, min(0.5, 0.005 * 2**attempt)))  # others finish first
    raise ObjectStoreError(
        f"The manifest of {str(run)!r} changed under each of {ATTEMPTS} commits in a row: "
        "too many writers at once. Nothing was listed by this one; retry it."
    )


def upload(run: ObjectUrl, local: Path, name: str, run_id: str) -> str:
    """Upload the record file ``local`` under a name no object in ``run`` has: ``name``,
    else ``name`` with ``-run-<id>`` (and a counter) inserted, as a disk does when another
    run holds a name. The object is whole or absent; the manifest does not list it yet."""
    store = bucket(run)
    stem, dot, suffix = name.rpartition(".")
    if not dot:
        raise ConfigError(
            f"{name!r} is a record directory (several processes wrote it); sharded records on "
            "object storage are not supported yet: push a run written by one process."
        )
    size = local.stat().st_size
    candidates = [name] + [f"{stem}-run-{run_id}{f'-{k}' if k else ''}.{suffix}" for k in range(8)]
    for candidate in candidates:
        if store.upload_new(run.child(candidate).key, str(local), size):
            return candidate
    raise ObjectStoreError(
        f"Every name tried for {name!r} in {str(run)!r} is taken by an object already; "
        "delete the objects the manifest does not list (nitro verify names them) and retry."
    )


Retention = Callable[[list[ManifestEntry]], set[str]]  # entries -> the files it unlists


def publish(
    run: ObjectUrl, local: Path, entry: ManifestEntry, retention: Retention | None
) -> ManifestEntry | None:
    """Upload the record ``local`` and commit ``entry`` for it; ``retention`` decides from
    the entries then listed (this one among them) which files to unlist (None: none), on
    each try of the commit. Returns the entry as listed, or None when retention dropped it
    at once. The
    objects retention unlisted are deleted after the commit; an upload whose commit failed is
    deleted (it was never listed)."""
    store = bucket(run)
    name = upload(run, local, entry.file, entry.run)
    entry = entry.model_copy(update={"file": name})

    def change(state: Manifest) -> set[str]:
        state.entries.append(entry)
        doomed = retention(state.entries) if retention is not None else set()
        state.entries = [e for e in state.entries if e.file not in doomed]
        state.add_point(entry.run, _point(entry))
        return doomed

    try:
        doomed = commit(run, change)
    except BaseException:
        _forget(store, run.child(name))
        raise
    for file in sorted(doomed):  # no committed manifest lists them any more
        _forget(store, run.child(file))
    return None if name in doomed else entry


def delete_unlisted(run: ObjectUrl, files: set[str]) -> None:
    """Unlist ``files`` in one commit, then delete their objects."""

    def change(state: Manifest) -> set[str]:
        gone = {e.file for e in state.entries if e.file in files}
        state.entries = [e for e in state.entries if e.file not in files]
        return gone

    store = bucket(run)
    for file in sorted(commit(run, change)):
        _forget(store, run.child(file))


def _forget(store: Bucket, url: ObjectUrl) -> None:
    try:
        store.delete(url.key)
    except (ObjectStoreError, ConfigError):
        pass  # an unlisted object is never read; `nitro verify` names those left behind


def _point(entry: ManifestEntry) -> Point:
    return Point(
        epoch=entry.epoch, batch=entry.batch, step=entry.step, score=entry.score,
        metric=entry.metric, mode=entry.mode,
    )  # fmt: skip


# -- reads ------------------------------------------------------------------------------------
def listed(record: ObjectUrl) -> ManifestEntry:
    """The manifest's entry of the record object ``record``; an object its run directory's
    manifest does not list is refused, never read as a record."""
    entries = read_manifest(record.parent)
    for e in entries:
        if e.file == record.name:
            return e
    shown = str(record.parent)
    raise CheckpointMissing(
        f"{str(record)!r} is not a record the manifest of {shown!r} lists (an object there "
        "that the manifest does not list is an upload whose commit never happened, and is "
        "never read). Listed: " + (", ".join(repr(e.file) for e in entries[-5:]) or "none") + ". ",
        Lister(shown),
        " lists them.",
    )


def read_header(record: ObjectUrl, expected: str) -> dict[str, Any]:
    """The ``nitro`` metadata of a listed record, from ranged reads of its header bytes
    only, checked against the manifest's digest ``expected``."""
    store, shown = bucket(record), record.shown()
    size = store.size(record.key)
    if size is None:
        raise _gone(record)
    first = store.get_range(record.key, 0, min(size, _FIRST))
    if len(first) < 8:
        raise record_header.unreadable(shown, "shorter than a safetensors header")
    (n,) = struct.unpack("<Q", first[:8])
    if n > record_header.MAX_HEADER or 8 + n > size:
        raise record_header.unreadable(shown, f"header length {n} does not fit {size} bytes")
    head = first[: 8 + n]
    if len(head) < 8 + n:
        head += store.get_range(record.key, len(head), 8 + n)
    record_header.check_header(shown, head, expected)
    try:
        header = json.loads(head[8:])
        meta = json.loads(header.pop("__metadata__")[record_header.META_KEY])
        if not isinstance(meta, dict):
            raise TypeError("its nitro metadata is not an object")
        data = max((v["data_offsets"][1] for v in header.values()), default=0)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise record_header.unreadable(shown, exc) from None
    if len(head) + data != size:
        if len(head) + data > size:
            raise record_header.truncated(shown, len(head) + data - size)
        raise record_header.appended(shown)
    return meta


def fetch(record: ObjectUrl, into: Path) -> Path:
    """Copy the listed record's bytes down into the directory ``into`` (ranged reads), for
    the readers that check every section against its digest."""
    store = bucket(record)
    size = store.size(record.key)
    if size is None:
        raise _gone(record)
    into.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=".fetch-", suffix=".tmp", dir=into)
    try:
        store.download(record.key, size, fd)
    except BaseException:
        os.close(fd)
        os.unlink(name)
        raise
    os.close(fd)
    target = into / record.name
    os.replace(name, target)
    return target


def _gone(record: ObjectUrl) -> CheckpointMissing:
    return CheckpointMissing(
        f"Checkpoint {str(record)!r} is listed by its manifest but the object is gone (deleted "
        "by hand, or by a lifecycle rule). Load another checkpoint (",
        Lister(str(record.parent)),
        " lists them) or restore the object from a backup.",
    )


__all__ = [
    "ATTEMPTS",
    "Listed",
    "commit",
    "delete_unlisted",
    "fetch",
    "listed",
    "fetch_entry",
    "load",
    "publish",
    "staging",
    "read_header",
    "read_manifest",
    "upload",
]
