"""A record file's header: opening the file (never through a link), reading and parsing its
header once, and everything the header alone can check, with the refusals every reader of
a record file shares.

:func:`parse` reads the header of an open record and checks it: its bytes, for a listed
record against the manifest's digest, for another against the digest its integrity block
carries (:func:`check_header`, :func:`check_sealed`); the JSON; tensors that tile the data
section with no gap and match their shapes; a file size equal to what the header describes
(a truncated file, or bytes past the end, are refused before any tensor is read). What it
returns, :class:`Header`, is the section table the reads work from
(:mod:`~nitro_core.store.mapped_read`, :mod:`~nitro_core.store.streamed_read`).
"""

from __future__ import annotations

import functools
import json
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from nitro_core.errors import CheckpointCorrupt, CheckpointMissing, Lister
from nitro_core.store import digest, shard_header
from nitro_core.store.manifest_file import paused_gc
from nitro_core.store.safeio import open_nofollow

if TYPE_CHECKING:  # a tensor's dtype; torch loads when a record's tensors are read
    import torch

META_KEY = "nitro"  # the safetensors metadata key holding Nitro's own JSON
# each safetensors dtype a record stores: torch's name for it and its bytes per element (the
# writer's table is made from this one), so a header is checked without torch
CODES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2),
    "BF16": ("bfloat16", 2), "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2),
    "I8": ("int8", 1), "U8": ("uint8", 1), "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1),
    "U16": ("uint16", 2), "U32": ("uint32", 4), "U64": ("uint64", 8),
}  # fmt: skip
ITEMSIZE = {code: size for code, (_, size) in CODES.items()}
MAX_HEADER = 100 * 1024 * 1024
_FIRST = 64 * 1024  # the first read: the length and, most often, the whole header


@dataclass(frozen=True)
class Tensor:
    """One tensor's place in the data section (offsets from its start)."""

    name: str
    code: str  # its safetensors dtype, e.g. "F32"
    shape: tuple[int, ...]
    begin: int
    end: int
    section: str

    @property
    def size(self) -> int:
        return self.end - self.begin

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.code]

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.code)


@functools.cache
def torch_dtype(code: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype code (torch loads here, with the first read)."""
    import torch  # lazy: a header is read without torch

    dtype: torch.dtype = getattr(torch, CODES[code][0])
    return dtype


@dataclass(frozen=True)
class Header:
    """A record's parsed header: its bytes (``head``: the length and the JSON), its nitro
    metadata, and its tensors in file order, which fill the ``data_bytes`` of the data
    section that starts right after the header (``data_start``)."""

    head: bytes
    meta: dict[str, Any]
    tensors: list[Tensor]
    data_bytes: int

    @property
    def data_start(self) -> int:
        return len(self.head)

    def section_names(self) -> list[str]:
        return sorted({t.section for t in self.tensors})


def open_record(path: Path) -> int:
    """A record opened for reading. Its name is never followed through a link: a listed
    record swapped for a link to a file elsewhere is refused unread (:class:`UnsafePath`); a
    name that holds no file (missing, a directory, a FIFO) is :class:`CheckpointMissing`."""
    try:
        fd = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO never blocks the open
    except (FileNotFoundError, NotADirectoryError):
        raise missing(path) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise missing(path)
    return fd


def missing(path: Path) -> CheckpointMissing:
    return CheckpointMissing(
        f"Checkpoint file {str(path)!r} is not on disk (deleted, or evicted by retention since "
        "it was named); ",
        Lister(str(path.parent)),
        " lists the records a run directory holds now.",
    )


def unreadable(path: PurePath, why: object) -> CheckpointCorrupt:
    return CheckpointCorrupt(
        f"Checkpoint {str(path)!r} is not a readable Nitro record ({why}); it may be "
        "truncated by an interrupted write. Load another checkpoint."
    )


def truncated(path: PurePath, short: int) -> CheckpointCorrupt:
    return CheckpointCorrupt(
        f"Checkpoint {str(path)!r} is truncated: it ends {short} bytes short of what its "
        "header describes. Load another checkpoint (",
        Lister(str(path.parent)),
        " lists them).",
    )


def appended(path: PurePath) -> CheckpointCorrupt:
    return CheckpointCorrupt(
        f"Checkpoint {str(path)!r} has bytes past the end its header describes."
    )


def check_header(path: PurePath, head: bytes, expected: str | None = None) -> None:
    """Refuse a header whose bytes are not what was written: against ``expected``, the
    manifest's digest of a listed record (``xxh3-128-tree:<hex>``), else against the digest
    the header carries (a record written before header digests carries none, and passes; an
    entry written before, ``sha256:<hex>``, is checked over the whole file by its reader)."""
    if expected is not None and expected.startswith(f"{digest.TREE}:"):
        if (actual := digest.tree(head)) != expected:
            raise CheckpointCorrupt(
                f"Checkpoint {str(path)!r} is corrupt: its header digests to "
                f"{digest.short(actual)}, the manifest recorded {digest.short(expected)} "
                "when it was written. Load another checkpoint (",
                Lister(str(path.parent)),
                " lists them) or restore this file from a backup.",
            )
        return
    found = digest.header_check(head)
    if found is not None and found[0] != found[1]:
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r} is corrupt: its header digests to "
            f"{digest.ALGORITHM}:{found[1][:16]}..., its integrity block recorded "
            f"{digest.ALGORITHM}:{found[0][:16]}... when it was written (the header was edited "
            "since). Load another checkpoint or restore this file from a backup."
        )


def check_sealed(path: PurePath, head: bytes, meta: dict[str, Any], expected: str | None) -> None:
    """Refuse a header that carries no digest of its own although its ``format_version``
    says it was written with one (:func:`nitro_core.store.digest.requires_header_digest`):
    its ``integrity`` key was renamed or removed, or the block moved, so :func:`check_header`
    found nothing to check. A listed record (``expected``) was checked against the manifest."""
    if expected is None and not digest.is_sealed(head) and digest.requires_header_digest(meta):
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r} is corrupt: its header carries no digest of its own "
            f"(integrity.header, first in its nitro metadata), yet it says format_version "
            f"{meta.get('format_version')!r}, written with one (a record written before header "
            f"digests says {digest.HEADER_DIGEST_SINCE - 1}); the header was edited since. Load "
            "another checkpoint or restore this file from a backup."
        )


def read_head(fd: int, path: Path, size: int) -> bytes:
    """The file's first ``8 + N`` bytes: the header length and the JSON header."""
    first = os.pread(fd, min(size, _FIRST), 0)
    if len(first) < 8:
        raise unreadable(path, "shorter than a safetensors header")
    (n,) = struct.unpack("<Q", first[:8])
    if n > MAX_HEADER or 8 + n > size:
        raise unreadable(path, f"header length {n} does not fit a file of {size} bytes")
    if len(first) < 8 + n:
        first += _pread_all(fd, 8 + n - len(first), len(first), path)
    return first[: 8 + n]


def _pread_all(fd: int, n: int, offset: int, path: Path) -> bytes:
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n and (k := os.preadv(fd, [view[got:]], offset + got)):
        got += k
    if got < n:
        raise truncated(path, n - got)
    return bytes(out)


def is_sharded(path: Path) -> bool:
    """Whether ``path`` is a record directory (never through a link)."""
    return path.is_dir() and not path.is_symlink()


def parse(fd: int, path: Path, expected: str | None = None) -> Header:
    """The header of the record open at ``fd``, checked against the file's size and, with
    ``expected`` (the manifest's digest), against the manifest; parsed once."""
    size = os.fstat(fd).st_size
    head = read_head(fd, path, size)
    check_header(path, head, expected)
    try:
        with paused_gc():  # thousands of small objects: skip the collector's scans
            header = json.loads(head[8:])
            meta = json.loads(header.pop("__metadata__")[META_KEY])
        if not isinstance(meta, dict):
            raise TypeError("its nitro metadata is not an object")
        check_sealed(path, head, meta, expected)
        entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
        tensors: list[Tensor] = []
        position = 0
        for name, info in entries:
            begin, end = info["data_offsets"]
            code = info["dtype"]
            itemsize = ITEMSIZE.get(code) if isinstance(code, str) else None
            shape = tuple(int(s) for s in info["shape"])
            count = 1
            for s in shape:
                count *= s
            if begin != position or itemsize is None or end - begin != count * itemsize:
                raise CheckpointCorrupt(
                    f"Checkpoint {str(path)!r} has a malformed header at tensor {name!r}."
                )
            tensors.append(Tensor(name, code, shape, begin, end, digest.section_of(name)))
            position = end
    except CheckpointCorrupt:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise unreadable(path, exc) from None
    described = len(head) + position
    if described > size:
        raise truncated(path, described - size)
    if described < size:
        raise appended(path)
    return Header(head, meta, tensors, position)


def runs(tensors: list[Tensor]) -> Iterator[list[Tensor]]:
    """Maximal groups of non-empty tensors whose bytes follow each other."""
    run: list[Tensor] = []
    for t in tensors:
        if t.size == 0:
            continue
        if run and run[-1].end != t.begin:
            yield run
            run = []
        run.append(t)
    if run:
        yield run


def read_header(path: Path, expected: str | None = None) -> dict[str, Any]:
    """The ``nitro`` metadata of a record, reading only the header bytes. A record Nitro
    wrote puts its metadata first and says how long its data is, so only the metadata is
    parsed, not the table of tensors; a truncated file is refused, and so is a header whose
    bytes differ from ``expected`` (the manifest's digest of a listed record) or, without it,
    from the digest the header carries."""
    path = Path(path)
    if is_sharded(path):  # a record directory: its header.json
        return shard_header.read_header(path, expected)
    fd = open_record(path)
    try:
        size = os.fstat(fd).st_size
        head = read_head(fd, path, size)
    finally:
        os.close(fd)
    check_header(path, head, expected)
    try:
        with paused_gc():  # thousands of small objects at once: skip the collector's scans
            meta, data_bytes = _metadata_first(head)
            if meta is None:
                header = json.loads(head[8:])
                meta = json.loads(header.pop("__metadata__")[META_KEY])
                data_bytes = max((v["data_offsets"][1] for v in header.values()), default=0)
        if not isinstance(meta, dict):
            raise TypeError("its nitro metadata is not an object")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise unreadable(path, exc) from None
    check_sealed(path, head, meta, expected)
    if len(head) + data_bytes > size:
        raise truncated(path, len(head) + data_bytes - size)
    return meta


_FIRST_KEY = b'{"__metadata__":'


def _metadata_first(head: bytes) -> tuple[Any, int]:
    """(metadata, data bytes) from a header that opens with its metadata and whose
    ``integrity`` block gives the data's length, else (None, 0)."""
    if not head.startswith(_FIRST_KEY, 8):
        return None, 0
    extra, _ = json.JSONDecoder().raw_decode(head[8:].decode(), len(_FIRST_KEY))
    meta = json.loads(extra[META_KEY])
    block = meta.get(digest.KEY) if isinstance(meta, dict) else None
    if not isinstance(block, dict) or type(block.get("data_bytes")) is not int:
        return None, 0
    return meta, block["data_bytes"]
