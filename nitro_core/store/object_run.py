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

import fcntl
import json
import os
import random
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
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
from nitro_core.store import digest, record_header
from nitro_core.store import reclaim as reclaim_
from nitro_core.store.manifest import Manifest, ManifestEntry, parse_manifest, point_of
from nitro_core.store.manifest_file import MANIFEST_NAME
from nitro_core.store.objects import PART, Bucket, ObjectUrl, bucket
from nitro_core.store.removal import Doomed, Removed, RemovedFile
from nitro_core.store.shard_header import HEADER_NAME

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
    got = bucket(run).get(run.child(MANIFEST_NAME).key, "manifest")
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


def fetch_entry(
    storage: ObjectUrl,
    entry: ManifestEntry,
    into: Path,
    sections: Collection[str] | None = None,
) -> Path:
    """A local copy of the listed record ``entry`` in ``into`` (its readers check it against
    the manifest's digest as they read): a record file, or a record directory
    (``header.json`` and the shards it names), fetched unless a copy of it is there.

    ``sections`` (a weights load's: params, buffers, EMA): a copy holding those at least,
    the whole copy where one is there, else one of those sections alone
    (:func:`fetch_sections`) in ``into/.sections/<its digest and the sections>/``, kept as
    a whole copy is. A record directory is copied whole."""
    if is_directory(entry.file):
        return fetch_directory(storage.child(entry.file), into)
    if sections is not None and not _whole_file(into / entry.file, entry):
        into = (
            into / ".sections" / f"{entry.expected.rpartition(':')[2]}-{'+'.join(sorted(sections))}"
        )
    into.mkdir(parents=True, exist_ok=True)
    with _fetch_lock(into / f".{entry.file}.fetch.lock"):  # ranks of a machine: one fetches
        target = into / entry.file
        if _whole_file(target, entry):  # a copy of this very record: never replaced under
            return target  # a reader, never downloaded twice
        if sections is not None:
            return fetch_sections(storage, entry, into, sections)
        return fetch(storage.child(entry.file), into)


def _whole_file(target: Path, entry: ManifestEntry) -> bool:
    """Whether ``target`` is a copy of the listed record ``entry``: its size, and its header
    against the manifest's digest (the header names every section's digest, which its
    readers check)."""
    if not entry.expected.startswith(f"{digest.TREE}:"):
        return False  # an entry written before header digests: always fetched afresh
    try:
        if os.lstat(target).st_size != entry.bytes:
            return False
        with open(target, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > record_header.MAX_HEADER:
                return False
            head = struct.pack("<Q", n) + f.read(n)
        record_header.check_header(target, head, entry.expected)
    except (OSError, struct.error, CheckpointCorrupt):
        return False
    return True


def is_directory(name: str) -> bool:
    """Whether a listed name is a record directory (several processes wrote it: a prefix
    holding ``header.json`` and one shard per rank) rather than a record file."""
    return not name.endswith(".safetensors")


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
    if is_directory(name):
        return _upload_directory(run, local, name, run_id)
    stem, _, suffix = name.rpartition(".")
    size = local.stat().st_size
    candidates = [name] + [f"{stem}-run-{run_id}{f'-{k}' if k else ''}.{suffix}" for k in range(8)]
    for candidate in candidates:
        if store.upload_new(run.child(candidate).key, str(local), size):
            return candidate
    raise ObjectStoreError(
        f"Every name tried for {name!r} in {str(run)!r} is taken by an object already; "
        "delete the objects the manifest does not list (nitro verify names them) and retry."
    )


def refuse_taken(url: ObjectUrl, what: str) -> None:
    """Refuse ``url`` as the name of a new file (an export, a saved average) when it does
    not end in ``.safetensors``, names the manifest, or an object has it already."""
    if not url.name.endswith(".safetensors"):
        raise ConfigError(
            f"{what} {str(url)!r} must name a .safetensors object (sources find records by that "
            "suffix), e.g. 's3://my-bucket/runs/avg10.safetensors'."
        )
    if bucket(url).size(url.key) is not None:
        raise ConfigError(
            f"{what} {str(url)!r} already exists; Nitro never overwrites an object. Choose a "
            "new name, or delete the old object first."
        )


def put_new(url: ObjectUrl, local: Path, what: str) -> None:
    """Upload the file ``local`` as the new object ``url``, outside any manifest (an export,
    a saved average: never listed, so never read as a record of a run directory), whole or
    not at all; refused when an object has that name by now."""
    if not bucket(url).upload_new(url.key, str(local), local.stat().st_size):
        raise ConfigError(
            f"{what} {str(url)!r} was created by another writer meanwhile; Nitro never "
            "overwrites an object. Choose a new name."
        )


def _upload_directory(run: ObjectUrl, local: Path, name: str, run_id: str) -> str:
    """Upload the record directory ``local`` under a fresh prefix (no object under it): each
    shard as a new object, ``header.json`` last; a name taken meanwhile moves on to the
    next candidate (what was sent under it is never listed)."""
    header = (local / HEADER_NAME).read_bytes()
    shards = sorted(p.name for p in local.iterdir() if p.name != HEADER_NAME)
    store = bucket(run)
    for candidate in [name] + [f"{name}-run-{run_id}{f'-{k}' if k else ''}" for k in range(8)]:
        if not claim_prefix(run, candidate, run_id):
            continue
        prefix = run.child(candidate)
        sent = all(
            store.upload_new(prefix.child(f).key, str(local / f), (local / f).stat().st_size)
            for f in shards
        )
        if sent and store.create(prefix.child(HEADER_NAME).key, header) is not None:
            return candidate
    raise ObjectStoreError(
        f"Every name tried for {name!r} in {str(run)!r} holds objects already; delete the "
        "objects the manifest does not list (nitro verify names them) and retry."
    )


# -- record directories written by several processes (FSDP) ------------------------------------
CLAIM = ".claim"  # the object that claims a record directory's prefix for one writer


def claim_prefix(run: ObjectUrl, name: str, run_id: str) -> bool:
    """Claim ``<run>/<name>/`` for a record directory: true when no object lay under it and
    this writer created its claim object (``If-None-Match: *``), so two writers reaching
    one name never both send shards there; false when anything was there (a killed write's
    leftovers, another writer's claim): the writer takes its next candidate name."""
    store, prefix = bucket(run), run.child(name)
    if store.keys(prefix.key + "/", limit=1):
        return False
    return store.create(prefix.child(CLAIM).key, run_id.encode()) is not None


def upload_shard(run: ObjectUrl, name: str, local: Path) -> None:
    """One rank's shard of the record directory ``name``, written and hashed at ``local``:
    sent as a new object under the record's prefix (never over another), then removed."""
    target = run.child(name).child(local.name)
    if not bucket(run).upload_new(target.key, str(local), local.stat().st_size):
        raise ObjectStoreError(
            f"{str(target)!r} exists already: another writer sent a record under the name "
            f"{name!r} meanwhile. Nothing was listed; continue with resume='auto'."
        )
    local.unlink()


def seal_directory(run: ObjectUrl, name: str, header: bytes, shards: list[str]) -> int:
    """Rank 0, once every rank's shard is up: send ``header.json`` (naming each shard's
    digest) as a new object; the record directory's bytes (its objects' sizes summed). It
    counts only once the manifest lists it."""
    store, prefix = bucket(run), run.child(name)
    sizes = [store.size(prefix.child(f).key) for f in shards]
    if any(size is None for size in sizes):
        missing = shards[sizes.index(None)]
        raise ObjectStoreError(
            f"{str(prefix.child(missing))!r} is missing though its rank sent it: the record "
            f"{name!r} is incomplete and is not listed. Continue with resume='auto'."
        )
    if store.create(prefix.child(HEADER_NAME).key, header) is None:
        raise ObjectStoreError(
            f"{str(prefix.child(HEADER_NAME))!r} exists already: another writer sent a record "
            f"under the name {name!r} meanwhile. Nothing was listed; continue with resume='auto'."
        )
    return len(header) + sum(size or 0 for size in sizes)


def fetch_directory(record: ObjectUrl, into: Path) -> Path:
    """Copy the listed record directory down into ``into``: ``header.json`` and the shards
    it names (its readers check every file against it, and it against the manifest). Ranks
    of one machine share the copy: one takes it (under a lock), the others find it whole."""
    store = bucket(record)
    got = store.get(record.child(HEADER_NAME).key, "record header")
    if got is None:
        raise _gone(record)
    try:
        shards = json.loads(got.body)["shards"]
        names = [str(n) for n in shards]
    except (ValueError, KeyError, TypeError) as exc:
        raise record_header.unreadable(record.shown(), exc) from None
    if any("/" in n or n in ("", ".", "..", HEADER_NAME) for n in names):
        raise CheckpointCorrupt(
            f"Checkpoint {str(record)!r}: its {HEADER_NAME} names a shard {names!r} that is "
            "not a file name. Load another checkpoint."
        )
    into.mkdir(parents=True, exist_ok=True)
    target = into / record.name
    with _fetch_lock(into / f".{record.name}.fetch.lock"):
        if _whole(target, got.body, names):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{record.name}.fetch-", dir=into))
        try:
            (tmp / HEADER_NAME).write_bytes(got.body)
            for name in names:
                fetch(record.child(name), tmp)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def _whole(target: Path, header: bytes, names: list[str]) -> bool:
    """Whether ``target`` is a copy of the record directory whose ``header.json`` is
    ``header`` with every shard it names (their bytes are checked as they are read)."""
    try:
        return (target / HEADER_NAME).read_bytes() == header and all(
            (target / n).is_file() for n in names
        )
    except OSError:
        return False


@contextmanager
def _fetch_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` while a copy is made (none where the file system has
    no locks, e.g. Lustre without ``-o flock``: each process then fetches for itself)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)


Retention = Callable[[list[ManifestEntry]], set[str]]  # entries -> the files it unlists


def publish(
    run: ObjectUrl,
    local: Path,
    entry: ManifestEntry,
    retention: Retention | None,
    *,
    copy: bool = False,
) -> ManifestEntry | None:
    """Upload the record ``local`` and commit ``entry`` for it; ``retention`` decides from
    the entries then listed (this one among them) which files to unlist (None: none), on
    each try of the commit. Returns the entry as listed, or None when retention dropped it
    at once (or, for a ``copy``, when the record was listed already: see
    :func:`list_entry`). The objects retention unlisted are deleted after the commit; an
    upload whose commit failed is deleted (it was never listed)."""
    name = upload(run, local, entry.file, entry.run)
    return list_entry(run, entry.model_copy(update={"file": name}), retention, copy=copy)


def list_entry(
    run: ObjectUrl, entry: ManifestEntry, retention: Retention | None, *, copy: bool = False
) -> ManifestEntry | None:
    """Commit ``entry`` for a record already sent whole under its name (see :func:`publish`);
    a failed commit deletes what was sent, unless a manifest lists it after all (a replace
    that succeeded though its answer was lost: it is then never listed twice either).

    An entry of the same run and digest listed under another name is this very record (its
    header, which names every section's digest, is the same bytes): a commit that a killed
    ``nitro push`` had sent whole and the store applied after this push read the manifest.
    It is not listed twice: what this call sent is deleted, unlisted, and the entry listed
    is returned (None for a ``copy``, a record ``nitro push`` copies: this call listed
    nothing). A record a run writes again after a resume is another record (its header
    holds the run's history, timings included): both are listed."""
    store, name = bucket(run), entry.file

    def change(state: Manifest) -> tuple[set[str], ManifestEntry | None]:
        twin = _twin(state.entries, entry)
        if twin is not None:
            return {name}, twin  # listed already under another name: this upload is redundant
        if not _lists(state.entries, entry):  # a retry after a replace whose answer was lost
            state.entries.append(entry)
            state.add_point(entry.run, point_of(entry))
        doomed = retention(state.entries) if retention is not None else set()
        state.entries = [e for e in state.entries if e.file not in doomed]
        return doomed, None

    try:
        doomed, twin = commit(run, change)
    except BaseException:
        try:
            listed_now = _lists(read_manifest(run), entry)
        except Exception:  # the outcome is unknown: leave an orphan, never delete a record
            listed_now = True
        if not listed_now:
            _forget(store, run.child(name))
        raise
    for file in sorted(doomed):  # no committed manifest lists them any more
        _forget(store, run.child(file))
    if twin is not None:
        return None if copy else twin
    return None if name in doomed else entry


def _lists(entries: list[ManifestEntry], entry: ManifestEntry) -> bool:
    return any(e.file == entry.file and e.digest == entry.digest for e in entries)


def _twin(entries: list[ManifestEntry], entry: ManifestEntry) -> ManifestEntry | None:
    """The entry listing the record ``entry`` describes under another name, if any."""
    return next(
        (
            e
            for e in entries
            if e.run == entry.run and e.digest == entry.digest and e.file != entry.file
        ),
        None,
    )


P = TypeVar("P", bound="Doomed")


def remove(
    run: ObjectUrl, decide: Callable[[Manifest], P], dry_run: bool = True
) -> tuple[P, Removed]:
    """A deletion on object storage: decide from the manifest, then (unless ``dry_run``)
    commit it without the plan's entries and the points of its whole runs (``decide`` runs
    again on a lost race, so an entry committed meanwhile is never deleted unseen), then
    delete the objects no committed manifest lists any more. A run's logs stay in the
    staging directory of the machine that trained it: nothing of them is on the store."""
    store = bucket(run)
    if dry_run:
        plan = decide(load(run).manifest.copy_out())
    else:

        def change(state: Manifest) -> P:
            plan = decide(state)
            going = {e.file for e in plan.entries}
            state.entries = [e for e in state.entries if e.file not in going]
            for name in plan.runs:
                state.points.pop(name, None)
            return plan

        plan = commit(run, change)
    files: list[RemovedFile] = []
    missing: list[str] = []
    for e in plan.entries:
        size = _size(store, run.child(e.file))
        if size is None:
            missing.append(e.file)
        else:
            files.append(RemovedFile(e.file, size, e.run))
    left: list[str] = []  # unlisted, but their deletion failed: orphans, never read
    if not dry_run:
        left = [f.path for f in files if not _forget(store, run.child(f.path))]
        files = [f for f in files if f.path not in left]
    return plan, Removed(tuple(files), tuple(missing), tuple(left), dry_run)


def _size(store: Bucket, url: ObjectUrl) -> int | None:
    """A listed record's bytes on the store (a record directory's objects summed), or None
    when it is gone."""
    if not is_directory(url.name):
        return store.size(url.key)
    keys = store.keys(url.key + "/")
    return sum(store.size(k) or 0 for k in keys) if keys else None


def _forget(store: Bucket, url: ObjectUrl) -> bool:
    """Delete an unlisted record: its object, or a record directory's objects
    (``header.json`` first, so what a failure leaves is never a whole-looking record).
    False when the store refused or failed (what is left is never read as a record, and
    ``nitro verify`` names it)."""
    try:
        if not is_directory(url.name):
            store.delete(url.key)
            return True
        keys = store.keys(url.key + "/")
        head = url.child(HEADER_NAME).key
        for key in sorted(keys, key=lambda k: k != head):
            store.delete(key)
    except (ObjectStoreError, ConfigError):
        return False
    return True


def reclaim(run: ObjectUrl, age: float, dry_run: bool) -> list[reclaim_.Leftover]:
    """Remove (``dry_run``: only say) the leftovers of killed writes under ``run``
    (:func:`nitro_core.store.reclaim.in_bucket`): a record directory's ``header.json``
    first; an upload aborted. What the store refuses to delete stays (never read as a
    record) and is left out of the answer."""
    store = bucket(run)
    found = reclaim_.in_bucket(store, run, load(run).manifest, age)
    if dry_run:
        return found
    gone = []
    for leftover in found:
        if leftover.what == "upload":
            assert leftover.upload_id is not None
            store.abort(run.child(leftover.name).key, leftover.upload_id)
            gone.append(leftover)
        elif _forget(store, run.child(leftover.name)):
            gone.append(leftover)
    return gone


# -- reads ------------------------------------------------------------------------------------
def standalone(record: ObjectUrl) -> bool:
    """Whether ``record`` lies under a prefix that holds no manifest: a record written on
    its own (an average's ``save=``, an export), uploaded whole under a name no object had,
    read as the same file on a disk is (verified by its own digests). Under a run
    directory's manifest, an unlisted object is an upload whose commit never happened."""
    return bucket(record).size(record.parent.child(MANIFEST_NAME).key) is None


def fetch_standalone(record: ObjectUrl, into: Path) -> Path:
    """A local copy in ``into`` of the standalone record ``record`` (a file, or a record
    directory: ``header.json`` and the shards it names), fetched afresh; its readers check
    every section against the digests its header names. Refused, as :func:`listed` refuses,
    where a manifest lies beside it."""
    if not standalone(record):
        listed(record)  # listed: read it through its entry; unlisted: refused there
    if is_directory(record.name):
        if bucket(record).size(record.child(HEADER_NAME).key) is None:
            raise _absent(record)
        return fetch_directory(record, into)
    if bucket(record).size(record.key) is None:
        raise _absent(record)
    return fetch(record, into)


def _absent(record: ObjectUrl) -> CheckpointMissing:
    return CheckpointMissing(
        f"No record at {str(record)!r}: no object has that name. Name a record by its URL "
        "(e.g. s3://bucket/avg/last2.safetensors), or a run directory's record by its source, "
        "e.g. 'latest => best' with run_dir=s3://bucket/runs/a."
    )


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
    if is_directory(record.name):
        return _directory_header(record, expected)
    _, header, _ = _head(record, expected)
    try:
        meta = json.loads(header["__metadata__"][record_header.META_KEY])
        if not isinstance(meta, dict):
            raise TypeError("its nitro metadata is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        raise record_header.unreadable(record.shown(), exc) from None
    return meta


def _head(record: ObjectUrl, expected: str) -> tuple[bytes, dict[str, Any], int]:
    """A listed record file's header bytes (``8 + N``), its parsed JSON header and the
    object's size, by ranged reads, checked against the manifest's digest and the size."""
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
        if not isinstance(header, dict):
            raise TypeError("it is not an object")
        data = max(
            (v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise record_header.unreadable(shown, exc) from None
    if len(head) + data != size:
        if len(head) + data > size:
            raise record_header.truncated(shown, len(head) + data - size)
        raise record_header.appended(shown)
    return head, header, size


def fetch_sections(
    storage: ObjectUrl, entry: ManifestEntry, into: Path, sections: Collection[str]
) -> Path:
    """A copy in ``into`` of the listed record ``entry`` holding only ``sections`` (an
    average reads params, buffers and EMA, never the optimizer state): its header, checked
    against the manifest, and those sections' bytes, by ranged reads; the file is as long as
    the record, the other sections' bytes holes its readers never read (a reader of a
    section checks it against the header's digest, so a hole read is refused). A record
    directory is copied whole."""
    if is_directory(entry.file):
        return fetch_directory(storage.child(entry.file), into)
    record = storage.child(entry.file)
    head, header, size = _head(record, entry.expected)
    spans = sorted(
        (len(head) + v["data_offsets"][0], len(head) + v["data_offsets"][1])
        for k, v in header.items()
        if k != "__metadata__" and digest.section_of(k) in sections
    )
    merged: list[list[int]] = []
    for start, stop in spans:  # sections lie together: a few ranges, each read in parts
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    parts = [(a, min(stop, a + PART)) for start, stop in merged for a in range(start, stop, PART)]

    def fill(fd: int) -> None:
        os.ftruncate(fd, size)  # the sections not fetched: holes
        os.pwrite(fd, head, 0)
        bucket(record).download_ranges(record.key, parts, fd)

    return _written(into, entry.file, fill)


def _written(into: Path, name: str, fill: Callable[[int], None]) -> Path:
    """``into/<name>``, made whole by ``fill(fd)`` in a temporary file first (a failure
    leaves nothing), then renamed into place."""
    into.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".fetch-", suffix=".tmp", dir=into)
    try:
        fill(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    target = into / name
    os.replace(tmp, target)
    return target


def _directory_header(record: ObjectUrl, expected: str) -> dict[str, Any]:
    """A listed record directory's ``header.json``, checked against the manifest's digest."""
    got = bucket(record).get(record.child(HEADER_NAME).key, "record header")
    if got is None:
        raise _gone(record)
    if digest.tree(got.body) != expected:
        raise CheckpointCorrupt(
            f"Checkpoint {str(record)!r}: its {HEADER_NAME} differs from the one the manifest "
            "listed (its digest does not match): it was changed or replaced after the commit. "
            "Load another checkpoint (nitro verify checks them all)."
        )
    try:
        header = json.loads(got.body)
        if not isinstance(header, dict):
            raise TypeError("it is not an object")
    except (ValueError, TypeError) as exc:
        raise record_header.unreadable(record.shown(), exc) from None
    header.pop("shards", None)  # its metadata, as a disk's record directory gives it
    return header


def fetch(record: ObjectUrl, into: Path) -> Path:
    """Copy the listed record's bytes down into the directory ``into`` (ranged reads), for
    the readers that check every section against its digest."""
    store = bucket(record)
    size = store.size(record.key)
    if size is None:
        raise _gone(record)
    return _written(into, record.name, lambda fd: store.download(record.key, size, fd))


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
    "fetch",
    "listed",
    "fetch_directory",
    "fetch_entry",
    "fetch_sections",
    "fetch_standalone",
    "standalone",
    "claim_prefix",
    "is_directory",
    "list_entry",
    "load",
    "publish",
    "put_new",
    "refuse_taken",
    "remove",
    "staging",
    "read_header",
    "read_manifest",
    "seal_directory",
    "upload",
    "upload_shard",
]
