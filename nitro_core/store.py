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
from safetensors import safe_open

from nitro_core.errors import CheckpointCorrupt, RecordError

META_KEY = "nitro"
MANIFEST_NAME = "manifest.json"
LOCK_NAME = ".manifest.lock"
TMP_SUFFIX = ".tmp"
_MAX_HEADER = 100 * 1024 * 1024
_CHUNK = 8 * 1024 * 1024

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
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
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
    path = Path(path)
    if not path.is_file():
        raise CheckpointCorrupt(
            f"Checkpoint file {str(path)!r} is missing; it was listed but is not on disk."
        )
    if sha256 is not None and (actual := file_sha256(path)) != sha256:
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r} is corrupt: its sha256 is {actual[:16]}..., the manifest "
            f"recorded {sha256[:16]}... when it was written. Load another checkpoint "
            "(read_manifest lists them) or restore this file from a backup."
        )
    meta = read_header(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as exc:  # safetensors raises its own types for every malformed file
        raise CheckpointCorrupt(f"Checkpoint {str(path)!r} is corrupt: {exc}.") from None
    return tensors, meta


def read_header(path: Path) -> dict[str, Any]:
    """The ``nitro`` metadata of a record, reading only the header bytes."""
    path = Path(path)
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
    except FileNotFoundError:
        raise
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
