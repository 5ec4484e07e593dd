"""Reclaiming a run directory's leftovers of killed writes, on both media: the one mechanism
behind :meth:`nitro_core.store.run.RunStore.reclaim`.

A leftover is what a process killed at the wrong moment leaves that no manifest lists and no
reader may take for a record:

- a record retention dropped from the manifest whose removal the kill cut short (on a disk
  and on object storage: the manifest commits first, the unlinks follow);
- on object storage, a record uploaded whole whose manifest commit never happened, a record
  directory's shards without the ``header.json`` that seals them, and a multipart upload
  never completed nor aborted (its parts hold bytes the store bills and lists nowhere).

Only what is provably such a leftover is removed: a name the run's writer gives records
(``epoch-0003-step-120...``), unlisted, older than any live writer could have left it
(``NITRO_RECLAIM_AFTER_S``, default one hour; on a disk a file whose writer still holds its
lock is never one), and, where a header can be read, written by one of the run directory's
own runs as a record, on object storage by any run (one killed before its first commit
is named by no manifest); an average or an export saved into the directory (``kind="weights"``
or ``averaged_from``) is the user's and stays. ``.tmp`` and ``.stale`` files of a disk's
interrupted writes are :mod:`nitro_core.store.claims`' (their writer's lock proves it).
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nitro_core.errors import ConfigError
from nitro_core.store import claims, deleter, record_header
from nitro_core.store.manifest import Manifest
from nitro_core.store.objects import Bucket, ObjectUrl
from nitro_core.store.shard_header import HEADER_NAME

AGE_VARIABLE = "NITRO_RECLAIM_AFTER_S"
DEFAULT_AGE_S = 3600.0
# the names the run's writer gives records: [prefix-]epoch-NNNN[-batch-NNNN]-step-N[...]
_RECORD = re.compile(r"(?:[\w.=-]+-)?epoch-\d{4,}(?:-batch-\d{4,})?-step-\d+(?:[-.][\w.=+-]*)?")
_PARTIAL = re.compile(r"\.tmp$|\.stale\d*$")  # a disk's interrupted writes: claims' own


@dataclass(frozen=True)
class Leftover:
    """One leftover: its name in the run directory, the bytes its removal frees, and what it
    is (``record``: a record or a record directory's objects; ``upload``: a multipart
    upload, named by its key)."""

    name: str
    bytes: int
    what: str = "record"
    upload_id: str | None = None


def age_s() -> float:
    """How old an unlisted record must be before it is a leftover (``NITRO_RECLAIM_AFTER_S``)."""
    text = os.environ.get(AGE_VARIABLE)
    if text is None or text.strip() == "":
        return DEFAULT_AGE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # NaN too
        raise ConfigError(
            f"{AGE_VARIABLE}={text!r} is not a number of seconds; set it to how old an unlisted "
            f"record must be before it is reclaimed, e.g. {AGE_VARIABLE}=3600, or unset it."
        )
    return value


def record_like(name: str) -> bool:
    """Whether ``name`` is one the run's writer gives a record (not a partial write's)."""
    return _RECORD.fullmatch(name) is not None and _PARTIAL.search(name) is None


def own_record(meta: dict[str, Any] | None, state: Manifest, any_run: bool = False) -> bool:
    """Whether a header's metadata says a training run wrote it as a record (an average's
    or an export's is the user's): one of the run directory's runs, or with ``any_run``
    any run (object storage, where an unlisted object is never read: a run killed before
    its first commit left it, and no manifest names that run); None (no header): a killed
    upload."""
    if meta is None:
        return True
    runs = {e.run for e in state.entries} | set(state.points)
    ours = meta.get("run") in runs or (any_run and isinstance(meta.get("run"), str))
    return ours and meta.get("averaged_from") is None and meta.get("kind") != "weights"


# -- a disk ----------------------------------------------------------------------------------
def on_disk(directory: Path, state: Manifest, age: float) -> list[Leftover]:
    """The leftovers in the run directory ``directory`` whose manifest is ``state`` (read
    under its lock)."""
    listed = {e.file for e in state.entries}
    now = time.time()
    found = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    for name in names:
        if name in listed or not record_like(name):
            continue
        path = directory / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if now - st.st_mtime < age or claims.in_flight(path):
            continue  # a live writer's, or too young to tell
        if not own_record(_local_header(path), state):
            continue
        found.append(Leftover(name, deleter.survey(path).bytes))
    return found


def _local_header(path: Path) -> dict[str, Any] | None:
    """A record's (or a record directory's) metadata; None when it has none to read."""
    try:
        if path.is_dir():
            meta = json.loads((path / HEADER_NAME).read_bytes())
            return meta if isinstance(meta, dict) else {}
        return record_header.read_header(path)
    except Exception:  # unreadable: not provably a record of ours
        return {}


# -- object storage --------------------------------------------------------------------------
def in_bucket(store: Bucket, run: ObjectUrl, state: Manifest, age: float) -> list[Leftover]:
    """The leftovers under the run directory ``run`` whose manifest is ``state``: unlisted
    records and record directories' objects, and open multipart uploads, older than
    ``age`` seconds."""
    listed = {e.file for e in state.entries}
    now = time.time()
    base = run.key + "/" if run.key else ""
    by_name: dict[str, list[tuple[str, int, float]]] = {}
    for key, size, modified in store.listing(base):
        name = key[len(base) :].split("/", 1)[0]
        by_name.setdefault(name, []).append((key, size, modified))
    found = []
    for name, objects in sorted(by_name.items()):
        if name in listed or not record_like(name):
            continue
        if now - max(m for _, _, m in objects) < age:
            continue  # a live writer's upload may still be listed by its commit
        if not own_record(_object_header(store, run.child(name), objects), state, any_run=True):
            continue
        found.append(Leftover(name, sum(s for _, s, _ in objects)))
    for key, upload, initiated in store.uploads(base):
        # its newest part too: a server may report a constant initiation time (moto does)
        if now - max([initiated, *store.part_times(key, upload)]) >= age:
            found.append(Leftover(key[len(base) :], 0, "upload", upload))
    return found


def _object_header(
    store: Bucket, record: ObjectUrl, objects: Iterable[tuple[str, int, float]]
) -> dict[str, Any] | None:
    """The metadata of an unlisted record object, or of a record directory's
    ``header.json``; None where a record directory has no header (a killed upload)."""
    keys = {k for k, _, _ in objects}
    try:
        if record.key in keys:  # a record file
            head = store.get_range(record.key, 0, 8)
            (n,) = struct.unpack("<Q", head)
            if n > record_header.MAX_HEADER:
                return {}
            header = json.loads(store.get_range(record.key, 8, 8 + n))
            meta = json.loads(header["__metadata__"][record_header.META_KEY])
            return meta if isinstance(meta, dict) else {}
        got = store.get(record.child(HEADER_NAME).key, "record header")
        if got is None:
            return None
        meta = json.loads(got.body)
        return meta if isinstance(meta, dict) else {}
    except Exception:  # unreadable: not provably a record of ours
        return {}


def described(where: str, leftovers: list[Leftover]) -> str:
    """What a reclaim removed, for its warning."""
    records = [x for x in leftovers if x.what == "record"]
    uploads = [x for x in leftovers if x.what == "upload"]
    parts = []
    if records:
        names = ", ".join(repr(x.name) for x in records[:3])
        more = f" and {len(records) - 3} more" if len(records) > 3 else ""
        parts.append(
            f"Reclaimed {sum(x.bytes for x in records)} bytes in {where!r}: removed "
            f"{len(records)} record(s) no manifest lists, left by killed writes ({names}{more})"
        )
    if uploads:
        names = ", ".join(repr(x.name) for x in uploads[:3])
        parts.append(
            f"aborted {len(uploads)} multipart upload(s) under {where!r} that no writer "
            f"completed ({names})"
        )
    return "; ".join(parts) + "."


__all__ = ["AGE_VARIABLE", "Leftover", "age_s", "described", "in_bucket", "on_disk"]
