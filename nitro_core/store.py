"""All file I/O of records and the manifest: the only module that opens them.

Records are standard safetensors files (8-byte little-endian header length, a JSON header,
then the tensor bytes), written by a streaming writer that hashes the bytes on a second
thread while it writes them, so a record is written once and never held twice in memory.
Nitro's own data rides in the header metadata under the key ``nitro`` as JSON.

Commit protocol, for records and the manifest alike: write ``<name>.tmp``, flush, fsync,
rename over ``<name>``, fsync the directory. The manifest is only ever rewritten under an
inter-process file lock (``.manifest.lock`` beside it).
"""

from __future__ import annotations

import fcntl
import gc
import hashlib
import json
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock

from nitro_core.errors import CheckpointCorrupt, CheckpointMissing, RecordError

META_KEY = "nitro"
MANIFEST_NAME = "manifest.json"
LOCK_NAME = ".manifest.lock"
TMP_SUFFIX = ".tmp"
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
def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_path(path: Path) -> Path:
    return path.with_name(path.name + TMP_SUFFIX)


def commit(write: Callable[[Any], Any], path: Path) -> Any:
    """Run ``write(file)`` into ``<path>.tmp``, then fsync, rename and fsync the directory."""
    tmp = tmp_path(path)
    with open(tmp, "wb") as f:
        result = write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return result


# -- reserving a record's name ---------------------------------------------------------------
@dataclass
class Reservation:
    """A record name claimed by this process: its ``.tmp`` is created and flock-ed, and the
    lock follows the inode through the rename until :meth:`release`, so another writer can
    tell a file in flight from one left by a killed process."""

    path: Path
    fd: int
    set_aside: list[Path]

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def reserve(path: Path) -> Reservation | None:
    """Claim ``path`` for a new record, or None when another live process is writing it.

    A ``.tmp`` or an unlisted final file that no live process holds is a leftover of an
    interrupted write: it is moved aside (``.stale``) rather than overwritten. Call with the
    manifest lock held, after checking the manifest does not list ``path``.
    """
    moved: list[Path] = []
    for leftover in (tmp_path(path), path):
        if leftover.exists():
            if in_flight(leftover):
                return None
            moved.append(set_aside(leftover, ".stale"))
    fd = os.open(tmp_path(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # blocking: only an in_flight() probe can hold it, briefly
    return Reservation(path=path, fd=fd, set_aside=moved)


def in_flight(path: Path) -> bool:
    """Whether a live process holds the write lock of ``path``."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the probe's lock
    return False


# -- records --------------------------------------------------------------------------------
def write_record(
    target: Path | Reservation, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]
) -> tuple[int, str]:
    """Write a record atomically; returns (bytes, sha256 hex) of the committed file.

    ``target`` is a :class:`Reservation` (the checkpoint writer's way: the file stays locked
    until its manifest entry is committed) or a plain path (exports, tests).

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
        for block in _blocks(struct.pack("<Q", len(head)) + head, tensors, order):
            pending.append(hasher.submit(sha.update, block))
            f.write(block)

        def digest() -> str:
            for job in pending:
                job.result()
            hasher.shutdown()
            return sha.hexdigest()

        return digest

    if isinstance(target, Reservation):
        with os.fdopen(os.dup(target.fd), "wb") as f:
            digest = write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path(target.path), target.path)
        fsync_dir(target.path.parent)
        return total, digest()
    return total, commit(write, target)()


def _blocks(head: bytes, tensors: Mapping[str, torch.Tensor], order: list[str]) -> Iterator[Any]:
    yield head
    for name in order:
        t = tensors[name].detach().contiguous()
        if t.numel() == 0:
            continue
        data = memoryview(t.reshape(-1).view(torch.uint8).numpy())
        for start in range(0, len(data), _CHUNK):
            yield data[start : start + _CHUNK]


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            sha.update(block)
    return sha.hexdigest()


def read_record(
    path: Path, sha256: str | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Load a record's tensors and metadata, checking its bytes against ``sha256`` if given."""
    meta = read_header(path)
    return dict(stream_record(path, sha256)), meta


class _HashingReader:
    """Reads a record front to back, hashing every byte on a second thread as it goes."""

    RING = 3  # piece buffers reused by read(..., reuse=True)

    def __init__(self, path: Path, f: Any, hasher: ThreadPoolExecutor) -> None:
        self.path, self.f, self.hasher = path, f, hasher
        self.sha = hashlib.sha256()
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
        job = self.hasher.submit(self.sha.update, view)
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
            header.pop("__metadata__", None)
            entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
        except (ValueError, KeyError, TypeError, struct.error) as exc:
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

    def finish(self, sha256: str | None) -> None:
        if self.f.read(1):
            raise CheckpointCorrupt(
                f"Checkpoint {str(self.path)!r} has bytes past the end its header describes."
            )
        for job in self.pending:
            job.result()
        if sha256 is not None and (actual := self.sha.hexdigest()) != sha256:
            raise CheckpointCorrupt(
                f"Checkpoint {str(self.path)!r} is corrupt: its sha256 is {actual[:16]}..., the "
                f"manifest recorded {sha256[:16]}... when it was written. Load another checkpoint "
                "(read_manifest lists them) or restore this file from a backup."
            )


@contextmanager
def _reader(path: Path) -> Iterator[_HashingReader]:
    path = Path(path)
    _must_exist(path)
    with open(path, "rb", buffering=0) as f, ThreadPoolExecutor(max_workers=1) as hasher:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        yield _HashingReader(path, f, hasher)


def _must_exist(path: Path) -> None:
    if not path.is_file():
        raise CheckpointMissing(
            f"Checkpoint file {str(path)!r} is not on disk (deleted, or evicted by retention since "
            "it was named); read_manifest lists the records a run directory holds now."
        )


def prefetch(path: Path) -> None:
    """Ask the kernel to start reading ``path`` into the page cache now, so that a later
    streamed read overlaps its disk time with the work done before it."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # the reader will report it
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
    with _reader(path) as r:
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
        r.finish(sha256)


def stream_chunks(
    path: Path, sha256: str | None, want: Callable[[str], bool]
) -> Iterator[tuple[str, list[int], int, torch.Tensor]]:
    """Like :func:`stream_record`, but yield each wanted tensor in flat pieces of at most
    4 MB, as ``(name, shape, first element, piece)``. A piece is valid only until the next
    one is yielded (the reader reuses a few fixed buffers), so memory holds no tensor of the
    record at all (the averaging accumulator reads records this way)."""
    with _reader(path) as r:
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
        r.finish(sha256)


def read_header(path: Path) -> dict[str, Any]:
    """The ``nitro`` metadata of a record, reading only the header bytes."""
    path = Path(path)
    _must_exist(path)
    try:
        with open(path, "rb") as f:
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
@contextmanager
def manifest_lock(directory: Path) -> Iterator[None]:
    """Hold the directory's inter-process manifest lock."""
    directory.mkdir(parents=True, exist_ok=True)
    with FileLock(directory / LOCK_NAME):
        yield


@contextmanager
def run_lock(directory: Path, run: str) -> Iterator[bool]:
    """Hold the run's training lock (``.run-<id>.lock``) for the block; yields False, holding
    nothing, when another live process holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / f".run-{run}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def load_manifest_bytes(directory: Path) -> bytes | None:
    """The manifest's bytes, or None when the directory has none."""
    try:
        return (Path(directory) / MANIFEST_NAME).read_bytes()
    except FileNotFoundError:
        return None


def save_manifest_json(directory: Path, data: Mapping[str, Any]) -> None:
    """Commit the manifest; the caller holds :func:`manifest_lock`."""
    body = json.dumps(data, indent=1, allow_nan=False).encode()
    commit(lambda f: f.write(body), Path(directory) / MANIFEST_NAME)


def remove_file(path: Path) -> None:
    """Delete a record the manifest no longer lists (already gone is fine)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def set_aside(path: Path, suffix: str) -> Path:
    """Rename an unlisted file out of the way of a write; returns its new path."""
    target = path.with_name(path.name + suffix)
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}{suffix}{n}")
    os.replace(path, target)
    fsync_dir(path.parent)
    return target
