"""All file I/O of records and the manifest: the only module that opens them.

Records are standard safetensors files (8-byte little-endian header length, a JSON header,
then the tensor bytes), written by a streaming writer that hashes the bytes on a second
thread while it writes them, so a record is written once and never held twice in memory.
Nitro's own data rides in the header metadata under the key ``nitro`` as JSON.

Commit protocol, for records and the manifest alike: write ``<name>.tmp``, flush, fsync,
rename over ``<name>``, fsync the directory. The manifest is only ever rewritten under an
inter-process file lock (``.manifest.lock`` beside it). A record outside any manifest (an
average, an export) is published with ``link``, which never replaces a file, so two writers
of one new name cannot both succeed.

Every record carries ``tensor_digest`` in its header: a digest of its data section (the
tensor bytes, in file order; :mod:`nitro_core.store.digest`). A reader checks the whole file
against the manifest's sha256 when it has one, and the data section against
``tensor_digest`` otherwise, so a record no manifest lists is checked too. The writer
hashes the host tensors in 8 MiB blocks on every core before it writes the header (memory
only, no extra I/O), then streams the file once while a second thread computes the
whole-file sha256 for the manifest.

Space is checked before a commit (the record's bytes, and room to rewrite the manifest
before the record is renamed into place), and a disk that fills anyway leaves no temporary
file behind: the error is :class:`DiskFull`. Nothing is opened through a link planted in
a run directory (:mod:`nitro_core.store.safeio`).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import stat
import struct
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from nitro_core.errors import CheckpointCorrupt, CheckpointMissing, DiskFull, RecordError
from nitro_core.store import digest, safeio
from nitro_core.store.claims import (
    LOCK_NAME,
    TMP_SUFFIX,
    Reservation,
    describe_reclaimed,
    in_flight,
    manifest_lock,
    publish_new,
    reclaim_stale,
    remove_file,
    reserve,
    run_lock,
    set_aside,
    tmp_path,
)
from nitro_core.store.safeio import fsync_dir, is_disk_full, open_nofollow

# the public names; those from claims are re-exported, so callers find every one here
__all__ = [
    "LOCK_NAME",
    "MANIFEST_NAME",
    "MANIFEST_ROOM",
    "META_KEY",
    "Reservation",
    "TMP_SUFFIX",
    "commit",
    "describe_reclaimed",
    "file_sha256",
    "fsync_dir",
    "in_flight",
    "load_manifest_bytes",
    "manifest_lock",
    "manifest_room",
    "paused_gc",
    "prefetch",
    "read_header",
    "read_record",
    "reclaim_stale",
    "remove_file",
    "reserve",
    "run_lock",
    "save_manifest_json",
    "set_aside",
    "stream_chunks",
    "stream_record",
    "tmp_path",
    "write_record",
]

META_KEY = "nitro"
MANIFEST_NAME = "manifest.json"
MANIFEST_ROOM = 64 * 1024  # free bytes kept beyond the manifest's size before a record commits
_MAX_HEADER = 100 * 1024 * 1024
_CHUNK = 8 * 1024 * 1024
_PIECE = 4 * 1024 * 1024  # streamed reads: a few of these are all a reader holds

_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
}


_FROM_CODE = {code: dtype for dtype, code in _DTYPES.items()}


# -- the commit protocol ------------------------------------------------------------------
def commit(
    write: Callable[[Any], Any], path: Path, disk_full: Callable[[int], DiskFull] | None = None
) -> Any:
    """Run ``write(file)`` into ``<path>.tmp``, then fsync, rename and fsync the directory.
    The ``.tmp`` is never followed through a link, and is removed when anything fails; a
    full disk raises ``disk_full(free bytes)`` (by default a :class:`DiskFull` naming
    ``path``)."""
    tmp = tmp_path(path)
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        with os.fdopen(fd, "wb") as f:
            result = write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        remove_file(tmp)
        if is_disk_full(exc):
            free = safeio.free_bytes(path.parent)
            raise (disk_full or _kept_as_it_was(path))(free) from None
        raise
    fsync_dir(path.parent)
    return result


def _kept_as_it_was(path: Path) -> Callable[[int], DiskFull]:
    return lambda free: DiskFull(
        f"No room left in {str(path.parent)!r} to write {path.name!r} ({free} bytes free): "
        f"{path.name!r} was kept as it was, and the temporary file removed. Free space on that "
        "disk and try again."
    )


# -- records --------------------------------------------------------------------------------
def write_record(
    target: Path | Reservation, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]
) -> tuple[int, str]:
    """Write a record atomically; returns (bytes, sha256 hex) of the committed file. The
    header gets ``tensor_digest``, the digest of the tensor bytes.

    ``target`` is a :class:`Reservation` (the checkpoint writer's way: the file stays locked
    until its manifest entry is committed; there must be room to rewrite the manifest before
    the record is renamed into place) or a plain path (averages, exports, tests), which is
    published only if no file has that name: a record is never overwritten.

    Every tensor must already be a host tensor: a leaf left on a device is refused here,
    by its path, before a byte is written.
    """
    for name, t in tensors.items():
        if t.device.type != "cpu":
            raise RecordError(
                f"Record leaf {name!r} is on device {t.device}, not on the host; every leaf "
                "must be converted with .cpu() before writing (records hold host tensors only)."
            )
        if t.dtype not in _DTYPES:
            raise RecordError(
                f"Record leaf {name!r} has dtype {t.dtype}, which safetensors cannot store; "
                f"convert it to one of {sorted(str(d) for d in _DTYPES)}."
            )
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    meta = {**meta, digest.KEY: digest.of_views(_blocks(b"", tensors, order))}
    header: dict[str, Any] = {"__metadata__": {META_KEY: json.dumps(meta, separators=(",", ":"))}}
    offset = 0
    for name in order:
        t = tensors[name]
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": _DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    total = 8 + len(head) + offset

    def write(f: Any) -> Callable[[], str]:
        """Write every block while a second thread hashes it; returns a function that waits
        for the hash, so the caller can fsync first and overlap the two."""
        sha = hashlib.sha256()
        hasher = ThreadPoolExecutor(max_workers=1)
        pending = []
        try:
            for block in _blocks(struct.pack("<Q", len(head)) + head, tensors, order):
                pending.append(hasher.submit(sha.update, block))
                f.write(block)
        except BaseException:
            hasher.shutdown(cancel_futures=True)
            raise

        def file_hash() -> str:
            for job in pending:
                job.result()
            hasher.shutdown()
            return sha.hexdigest()

        return file_hash

    if isinstance(target, Reservation):
        return total, _commit_reserved(target, write, total)
    return total, publish_new(Path(target), write, total)


def _commit_reserved(target: Reservation, write: Callable[[Any], Any], total: int) -> str:
    """Write into the reservation's ``.tmp``, then rename it into place once the manifest
    can be rewritten. The caller removes the ``.tmp`` when this raises."""
    path = target.path
    room = manifest_room(path.parent)
    detail = f" ({total} for the record, {room} to rewrite manifest.json)"
    safeio.require_room(path, total + room, detail)
    try:
        with os.fdopen(os.dup(target.fd), "wb") as f:
            file_hash = write(f)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        if is_disk_full(exc):
            raise safeio.no_room(path, total, safeio.free_bytes(path.parent)) from None
        raise
    room = manifest_room(path.parent)  # other writers may have taken space meanwhile
    safeio.require_room(path, room, " to rewrite manifest.json after it is written")
    os.replace(tmp_path(path), path)
    fsync_dir(path.parent)
    return file_hash()


def _blocks(head: bytes, tensors: Mapping[str, torch.Tensor], order: list[str]) -> Iterator[Any]:
    yield head
    for name in order:
        t = tensors[name].detach().contiguous()
        if t.numel() == 0:
            continue
        data = t.reshape(-1).view(torch.uint8).numpy().data  # a memoryview of its bytes
        for start in range(0, len(data), _CHUNK):
            yield data[start : start + _CHUNK]


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as f:
        while block := f.read(_CHUNK):
            sha.update(block)
    return sha.hexdigest()


def read_record(
    path: Path, sha256: str | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Load a record's tensors and metadata, checking its bytes against ``sha256`` if given,
    else its tensor bytes against the ``tensor_digest`` in its header."""
    meta = read_header(path)
    return dict(stream_record(path, sha256)), meta


class _HashingReader:
    """Reads a record front to back, hashing on a second thread as it goes: every byte when
    a whole-file ``sha256`` is expected, else the data section when the header carries a
    ``tensor_digest`` (a record from before the digest, read without a sha256: nothing)."""

    RING = 3  # piece buffers reused by read(..., reuse=True)

    def __init__(self, path: Path, f: Any, hasher: ThreadPoolExecutor, sha256: str | None) -> None:
        self.path, self.f, self.hasher = path, f, hasher
        self.sha = hashlib.sha256()
        self.expected = sha256
        self.digest: str | None = None  # the header's tensor_digest, checked without sha256
        self.folder = digest.Folder()
        self.hashing = sha256 is not None
        self.pending: list[Any] = []
        self.ring: list[tuple[memoryview, Any]] = []
        self.turn = 0

    def read(self, nbytes: int, reuse: bool = False) -> memoryview:
        """The next ``nbytes`` of the file, queued for hashing. With ``reuse`` the bytes land
        in one of a few fixed chunk buffers (valid until the buffer comes round again, after
        its hash is done), so streaming a file allocates nothing per chunk."""
        if reuse:
            if len(self.ring) < self.RING:
                self.ring.append((memoryview(bytearray(_PIECE)), None))
            slot = self.turn % len(self.ring)
            buffer, job = self.ring[slot]
            if job is not None:
                job.result()
            view = buffer[:nbytes]
        else:
            view = memoryview(bytearray(nbytes))
        got = 0
        while got < nbytes and (n := self.f.readinto(view[got:])):
            got += n
        if got < nbytes:
            raise CheckpointCorrupt(
                f"Checkpoint {str(self.path)!r} is truncated: it ends {nbytes - got} bytes short "
                "of what its header describes. Load another checkpoint (read_manifest lists them)."
            )
        update = self.sha.update if self.digest is None else self.folder.update
        job = self.hasher.submit(update, view) if self.hashing else None
        if job is not None:
            self.pending.append(job)
        while len(self.pending) > self.RING:  # bound the chunks held for hashing
            self.pending.pop(0).result()
        if reuse:
            self.ring[self.turn % len(self.ring)] = (self.ring[self.turn % len(self.ring)][0], job)
            self.turn += 1
        return view

    def tensors(self) -> list[tuple[str, dict[str, Any]]]:
        """The header's tensor entries in file order, checked to tile the data exactly."""
        try:
            (n,) = struct.unpack("<Q", self.read(8))
            size = os.fstat(self.f.fileno()).st_size
            if n > _MAX_HEADER or 8 + n > size:
                raise ValueError(f"header length {n} does not fit a file of {size} bytes")
            with paused_gc():
                header = json.loads(bytes(self.read(n)))
            extra = header.pop("__metadata__", None) or {}
            entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
            if self.expected is None and META_KEY in extra:
                with paused_gc():
                    self.digest = json.loads(extra[META_KEY]).get(digest.KEY)
                self.hashing = self.digest is not None  # from here on: the data section
        except (ValueError, KeyError, TypeError, AttributeError, struct.error) as exc:
            raise CheckpointCorrupt(
                f"Checkpoint {str(self.path)!r} is not a readable record ({exc})."
            ) from None
        position = 0
        for name, info in entries:
            begin, end = info["data_offsets"]
            if begin != position or info["dtype"] not in _FROM_CODE:
                raise CheckpointCorrupt(
                    f"Checkpoint {str(self.path)!r} has a malformed header at tensor {name!r}."
                )
            position = end
        return entries

    def finish(self) -> None:
        if self.f.read(1):
            raise CheckpointCorrupt(
                f"Checkpoint {str(self.path)!r} has bytes past the end its header describes."
            )
        for job in self.pending:
            job.result()
        if self.expected is not None and (actual := self.sha.hexdigest()) != self.expected:
            raise CheckpointCorrupt(
                f"Checkpoint {str(self.path)!r} is corrupt: its sha256 is {actual[:16]}..., the "
                f"manifest recorded {self.expected[:16]}... when it was written. Load another "
                "checkpoint (read_manifest lists them) or restore this file from a backup."
            )
        if self.digest is not None and (actual := self.folder.value()) != self.digest:
            raise CheckpointCorrupt(
                f"Checkpoint {str(self.path)!r} is corrupt: its tensor bytes digest to "
                f"{_short(actual)}, its header recorded {_short(self.digest)} when it was "
                "written. Load another checkpoint or restore this file from a backup."
            )


def _short(tensor_digest: str) -> str:
    algorithm, _, hexdigest = str(tensor_digest).partition(":")
    return f"{algorithm}:{hexdigest[:16]}..."


@contextmanager
def _reader(path: Path, sha256: str | None) -> Iterator[_HashingReader]:
    path = Path(path)
    with (
        os.fdopen(_open_record(path), "rb", buffering=0) as f,
        ThreadPoolExecutor(max_workers=1) as hasher,
    ):
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        yield _HashingReader(path, f, hasher, sha256)


def _open_record(path: Path) -> int:
    """A record opened for reading. Its name is never followed through a link: a listed
    record swapped for a link to a file elsewhere is refused unread (:class:`UnsafePath`); a
    name that holds no file (missing, a directory, a FIFO) is :class:`CheckpointMissing`."""
    try:
        fd = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO never blocks the open
    except (FileNotFoundError, NotADirectoryError):
        raise _missing(path) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _missing(path)
    return fd


def _missing(path: Path) -> CheckpointMissing:
    return CheckpointMissing(
        f"Checkpoint file {str(path)!r} is not on disk (deleted, or evicted by retention since "
        "it was named); read_manifest lists the records a run directory holds now."
    )


def prefetch(path: Path) -> None:
    """Ask the kernel to start reading ``path`` into the page cache now, so that a later
    streamed read overlaps its disk time with the work done before it."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return  # a link, or missing: the reader will report it
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


def stream_record(
    path: Path, sha256: str | None = None, want: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for the tensors ``want`` selects, in file order, reading the
    file once while a second thread hashes it. A mismatch with ``sha256`` (or a truncated or
    malformed file) raises :class:`CheckpointCorrupt` after the last byte, so a consumer
    must exhaust the iterator before trusting what it built."""
    with _reader(path, sha256) as r:
        for name, info in r.tensors():
            begin, end = info["data_offsets"]
            dtype = _FROM_CODE[info["dtype"]]
            if want is None or want(name):
                data = r.read(end - begin)
                tensor = (
                    torch.frombuffer(data, dtype=dtype)
                    if end > begin
                    else torch.empty(0, dtype=dtype)
                )
                yield name, tensor.reshape(info["shape"])
            else:
                for start in range(begin, end, _PIECE):
                    r.read(min(_PIECE, end - start), reuse=True)
        r.finish()


def stream_chunks(
    path: Path, sha256: str | None, want: Callable[[str], bool]
) -> Iterator[tuple[str, list[int], int, torch.Tensor]]:
    """Like :func:`stream_record`, but yield each wanted tensor in flat pieces of at most
    4 MB, as ``(name, shape, first element, piece)``. A piece is valid only until the next
    one is yielded (the reader reuses a few fixed buffers), so memory holds no tensor of the
    record at all (the averaging accumulator reads records this way)."""
    with _reader(path, sha256) as r:
        for name, info in r.tensors():
            begin, end = info["data_offsets"]
            dtype = _FROM_CODE[info["dtype"]]
            size = torch.empty((), dtype=dtype).element_size()
            step = _PIECE - _PIECE % size
            for start in range(begin, end, step):
                piece = r.read(min(step, end - start), reuse=True)
                if want(name):
                    yield (
                        name,
                        info["shape"],
                        (start - begin) // size,
                        torch.frombuffer(piece, dtype=dtype),
                    )
            if begin == end and want(name):
                yield name, info["shape"], 0, torch.empty(0, dtype=dtype)
        r.finish()


def read_header(path: Path) -> dict[str, Any]:
    """The ``nitro`` metadata of a record, reading only the header bytes."""
    path = Path(path)
    fd = _open_record(path)
    try:
        with os.fdopen(fd, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(0)
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("shorter than a safetensors header")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER or 8 + n > size:
                raise ValueError(f"header length {n} does not fit a file of {size} bytes")
            raw = f.read(n)
        with paused_gc():  # thousands of small objects at once: skip the collector's scans
            header = json.loads(raw)
            meta = json.loads(header["__metadata__"][META_KEY])
        data_end = max(
            (v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0
        )
        if 8 + n + data_end > size:
            raise ValueError(
                f"the header describes {8 + n + data_end} bytes, the file holds {size}"
            )
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r} is not a readable Nitro record ({exc}); it may be "
            "truncated by an interrupted write. Load another checkpoint."
        ) from None
    return meta


@contextmanager
def paused_gc() -> Iterator[None]:
    """Parse a large JSON document without the cyclic collector scanning every new object
    (with torch imported a full collection takes ~100 ms); it is acyclic, so nothing leaks."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# -- the manifest ---------------------------------------------------------------------------
def load_manifest_bytes(directory: Path) -> bytes | None:
    """The manifest's bytes, or None when the directory has none. A ``manifest.json`` that is
    a link is refused unread (:class:`UnsafePath`)."""
    try:
        fd = open_nofollow(Path(directory) / MANIFEST_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def save_manifest_json(directory: Path, data: Mapping[str, Any]) -> None:
    """Commit the manifest; the caller holds :func:`manifest_lock`."""
    directory = Path(directory)
    body = json.dumps(data, indent=1, allow_nan=False).encode()

    def disk_full(free: int) -> DiskFull:
        return DiskFull(
            f"No room left in {str(directory)!r} to rewrite manifest.json: it needs {len(body)} "
            f"bytes, {free} are free. Kept: manifest.json as it was before this update, with "
            "every record it lists (the temporary file was removed); a record written for this "
            "update is not listed and counts for nothing. Free space on that disk and resume "
            "with resume='auto'."
        )

    commit(lambda f: f.write(body), directory / MANIFEST_NAME, disk_full)


def manifest_room(directory: Path) -> int:
    """Free bytes a rewrite of ``directory``'s manifest needs: its size and a margin (the
    new one is written beside the old before the rename frees it)."""
    try:
        size = os.lstat(Path(directory) / MANIFEST_NAME).st_size
    except FileNotFoundError:
        size = 0
    return size + MANIFEST_ROOM
