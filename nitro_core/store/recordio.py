"""All file I/O of records and the manifest goes through here: their commits (through
:mod:`~nitro_core.store.atomic`), the record writer and reader (:mod:`~nitro_core.store.writer`,
:mod:`~nitro_core.store.reader`, re-exported), the manifest's bytes, the locks.

Records are standard safetensors files (8-byte little-endian header length, a JSON header,
then the tensor bytes). Nitro's own data rides in the header metadata under the key
``nitro`` as JSON, with an ``integrity`` block naming the xxh3-128 of each section of the
data (params, buffers, optim, ema, rng); the manifest lists a record with the xxh3-128 of its
header bytes, which covers every byte of the file (:mod:`nitro_core.store.digest`). A reader
verifies exactly the sections it reads, and checks the header against the manifest when the
record is listed; ``nitro verify`` checks every section.

Commits go through :mod:`nitro_core.store.atomic`, the one commit protocol (write
``<name>.tmp``, flush, fsync, rename or link, fsync the directory): a record a manifest will
list is renamed from its reservation (:class:`~nitro_core.store.atomic.Reserved`), the
manifest replaced (:class:`~nitro_core.store.atomic.Replace`), only ever under an
inter-process file lock (``.manifest.lock`` beside it). A record outside any manifest (an
average, an export) is published with ``link``, which never replaces a file, so two writers
of one new name cannot both succeed (:class:`~nitro_core.store.atomic.PublishNew`).

Space is checked before a commit (the record's bytes, and room to rewrite the manifest
before the record is renamed into place), and a disk that fills anyway leaves no temporary
file behind: the error is :class:`DiskFull`. Nothing is opened through a link planted in
a run directory (:mod:`nitro_core.store.safeio`).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch

from nitro_core.store import digest, shards
from nitro_core.store.atomic import TMP_SUFFIX, PublishNew, Reserved, tmp_path
from nitro_core.store.claims import (
    LOCK_NAME,
    Reservation,
    describe_reclaimed,
    in_flight,
    manifest_lock,
    reclaim_stale,
    remove_file,
    reserve,
    run_lock,
    set_aside,
)
from nitro_core.store.manifest_file import (
    MANIFEST_NAME,
    MANIFEST_ROOM,
    load_manifest_bytes,
    manifest_room,
    paused_gc,
    save_manifest_bytes,
    save_manifest_json,
)
from nitro_core.store.reader import RecordFile, prefetch
from nitro_core.store.record_header import META_KEY, open_record, read_head, read_header
from nitro_core.store.safeio import fsync_dir, open_nofollow
from nitro_core.store.writer import Layout, check_host, writer

# the public names; those of atomic, claims and reader re-exported: callers find every one here
__all__ = [
    "LOCK_NAME",
    "MANIFEST_NAME",
    "MANIFEST_ROOM",
    "META_KEY",
    "RecordFile",
    "Reservation",
    "TMP_SUFFIX",
    "describe_reclaimed",
    "file_digest",
    "file_sha256",
    "fsync_dir",
    "in_flight",
    "load_manifest_bytes",
    "manifest_lock",
    "manifest_room",
    "open_record_file",
    "paused_gc",
    "prefetch",
    "read_header",
    "read_record",
    "reclaim_stale",
    "remove_file",
    "reserve",
    "run_lock",
    "save_manifest_bytes",
    "save_manifest_json",
    "set_aside",
    "tmp_path",
    "write_record",
]

_CHUNK = 8 * 1024 * 1024


# -- records --------------------------------------------------------------------------------
def write_record(
    target: Path | Reservation, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]
) -> tuple[int, str]:
    """Write a record atomically; returns (bytes, the manifest's digest of the committed file,
    ``xxh3-128-tree:<hex>``). The header gets an ``integrity`` block: a digest per section.

    ``target`` is a :class:`Reservation` (the checkpoint writer's way: the file stays locked
    until its manifest entry is committed; there must be room to rewrite the manifest before
    the record is renamed into place) or a plain path (averages, exports, tests), which is
    published only if no file has that name: a record is never overwritten.

    Every tensor must already be a host tensor: a leaf left on a device is refused here,
    by its path, before a byte is written.
    """
    check_host(tensors)
    layout = Layout(tensors, meta)
    total = len(layout.header(None)) + layout.data_bytes
    if isinstance(target, Reservation):  # the caller removes the .tmp when this raises
        room = functools.partial(manifest_room, target.path.parent)  # asked again at the rename
        file_hash = Reserved(target.path, target.fd, total, room).commit(writer(layout))
    else:
        file_hash = PublishNew(Path(target), total).commit(writer(layout))
    return total, str(file_hash())


def file_sha256(path: Path) -> str:
    """The sha256 of a whole file (what manifests written before listed)."""
    sha = hashlib.sha256()
    with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as f:
        while block := f.read(_CHUNK):
            sha.update(block)
    return sha.hexdigest()


def file_digest(path: Path) -> str:
    """The manifest's digest of a record on disk (``xxh3-128-tree:<hex>``, its header's
    hash), reading the header bytes only; :meth:`RecordFile.verify` checks the rest."""
    fd = open_record(Path(path))
    try:
        return digest.tree(read_head(fd, Path(path), os.fstat(fd).st_size))
    finally:
        os.close(fd)


def read_record(
    path: Path, expected: str | None = None, sections: Collection[str] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A record's tensors (those of ``sections``, or all) and metadata, verified: the header
    against ``expected`` (the manifest's digest) when given, the sections read against the
    header."""
    with open_record_file(Path(path), expected) as record:
        return record.read(sections), record.meta


def open_record_file(path: Path, expected: str | None = None) -> Any:
    """A record opened for reading: a :class:`RecordFile`, or for a record directory
    (several processes wrote it) a :class:`~nitro_core.store.shards.ShardedRecord`, which
    reads the same way."""
    if shards.is_sharded(Path(path)):
        return shards.ShardedRecord(Path(path), expected)
    return RecordFile(Path(path), expected)
