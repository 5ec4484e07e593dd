"""Reading a record: one header parse, tensors made straight from the file's pages, and
exactly the sections read verified (:mod:`nitro_core.store.digest`).

:class:`RecordFile` opens a record (never through a link), parses its header once, and
checks what the header alone can tell: the JSON, tensors that tile the data section with
no gap and match their shapes, a file size equal to what the header describes (a truncated
file, or bytes past the end, are refused before any tensor is read), and the header bytes:
for a listed record against the manifest's digest, for another against the digest its
integrity block carries. Then:

- :meth:`RecordFile.read` makes each wanted tensor a view of its bytes in a private memory
  mapping of the file (pages read on first touch, copied only when written; no copy; a
  tensor under 64 KiB gets its own storage) and hashes its sections piece by piece while each
  piece is cached; a mismatch raises before anything is returned.
- :meth:`RecordFile.stream` reads the wanted sections' tensors (``preadv``, not the
  mapping) in pieces of a few MiB into two reused buffers, so a reader that folds them into
  something else (the averaging sum) holds nothing but those buffers; a caller with a core
  to spare passes a one-thread executor that reads and hashes the next piece meanwhile.
- :meth:`RecordFile.verify` hashes every section (``nitro verify``).

Otherwise hashing runs on the caller's thread: a reader adds no computing thread the caller
did not give it. The kernel reads ahead: :meth:`RecordFile.read` keeps it 8 MiB ahead of
itself in the ranges it still wants, asked of one read-ahead thread that only waits on the
disk (:mod:`nitro_core.store.readahead`), so the disk works while the caller computes (a
stream's reads in file order get the kernel's own read-ahead), and
:meth:`RecordFile.prefetch` asks for a whole section at once.

Records are never modified once published (a writer renames a new file into place, and
retention only unlinks), which is what lets tensors live on a record's pages.

A record written before sections carries ``tensor_digest`` (sha256 of 8 MiB blocks of the
data) and its manifest entry the ``sha256`` of the whole file: such a record is hashed
whole, every byte as before, whatever sections are wanted.
"""

from __future__ import annotations

import gc
import hashlib
import json
import mmap
import os
import stat
import struct
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nitro_core.errors import CheckpointCorrupt, CheckpointMissing
from nitro_core.store import digest, readahead
from nitro_core.store.safeio import open_nofollow
from nitro_core.store.writer import FROM_CODE, META_KEY

MAX_HEADER = 100 * 1024 * 1024
_PIECE = 4 * 1024 * 1024  # bytes hashed (while cached) per call; a streamed piece
_OWN = 64 * 1024  # tensors under this get their own storage, not a view of the mapping
_AHEAD = 8 * 1024 * 1024  # bytes a reader keeps the kernel reading ahead of itself
_FIRST = 64 * 1024  # the first read: the length and, most often, the whole header


@dataclass(frozen=True)
class Tensor:
    """One tensor's place in the data section (offsets from its start)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int
    section: str

    @property
    def size(self) -> int:
        return self.end - self.begin


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
        "it was named); read_manifest lists the records a run directory holds now."
    )


def unreadable(path: Path, why: object) -> CheckpointCorrupt:
    return CheckpointCorrupt(
        f"Checkpoint {str(path)!r} is not a readable Nitro record ({why}); it may be "
        "truncated by an interrupted write. Load another checkpoint."
    )


def truncated(path: Path, short: int) -> CheckpointCorrupt:
    return CheckpointCorrupt(
        f"Checkpoint {str(path)!r} is truncated: it ends {short} bytes short of what its "
        "header describes. Load another checkpoint (read_manifest lists them)."
    )


def appended(path: Path) -> CheckpointCorrupt:
    return CheckpointCorrupt(
        f"Checkpoint {str(path)!r} has bytes past the end its header describes."
    )


def check_header(path: Path, head: bytes, expected: str | None = None) -> None:
    """Refuse a header whose bytes are not what was written: against ``expected``, the
    manifest's digest of a listed record (``xxh3-128-tree:<hex>``), else against the digest
    the header carries (a record written before header digests carries none, and passes; an
    entry written before, ``sha256:<hex>``, is checked over the whole file by its reader)."""
    if expected is not None and expected.startswith(f"{digest.TREE}:"):
        if (actual := digest.tree(head)) != expected:
            raise CheckpointCorrupt(
                f"Checkpoint {str(path)!r} is corrupt: its header digests to "
                f"{digest.short(actual)}, the manifest recorded {digest.short(expected)} "
                "when it was written. Load another checkpoint (read_manifest lists them) "
                "or restore this file from a backup."
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


def check_sealed(path: Path, head: bytes, meta: dict[str, Any], expected: str | None) -> None:
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


class RecordFile:
    """An open record, its header parsed once and checked against the file's size and, with
    ``expected`` (the manifest's digest: ``xxh3-128-tree:<hex>``, or ``sha256:<hex>`` of an
    entry written before), against the manifest."""

    def __init__(self, path: Path, expected: str | None = None) -> None:
        self.path = Path(path)
        self.map: mmap.mmap | None = None
        self.advised = 0  # file offset up to which the kernel was asked to read ahead
        self.fd = open_record(self.path)
        try:
            self._parse(expected)
        except BaseException:
            os.close(self.fd)
            raise

    def _parse(self, expected: str | None) -> None:
        path = self.path
        size = os.fstat(self.fd).st_size
        self.head = read_head(self.fd, path, size)
        check_header(path, self.head, expected)
        try:
            with paused_gc():  # thousands of small objects: skip the collector's scans
                header = json.loads(self.head[8:])
                meta = json.loads(header.pop("__metadata__")[META_KEY])
            if not isinstance(meta, dict):
                raise TypeError("its nitro metadata is not an object")
            self.meta: dict[str, Any] = meta
            check_sealed(path, self.head, meta, expected)
            entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
            self.tensors: list[Tensor] = []
            position = 0
            for name, info in entries:
                begin, end = info["data_offsets"]
                dtype = FROM_CODE.get(info["dtype"])
                shape = tuple(int(s) for s in info["shape"])
                count = 1
                for s in shape:
                    count *= s
                if (
                    begin != position
                    or dtype is None
                    or end - begin != count * _element_size(dtype)
                ):
                    raise CheckpointCorrupt(
                        f"Checkpoint {str(path)!r} has a malformed header at tensor {name!r}."
                    )
                self.tensors.append(Tensor(name, dtype, shape, begin, end, digest.section_of(name)))
                position = end
        except CheckpointCorrupt:
            raise
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise unreadable(path, exc) from None
        self.data_start = len(self.head)
        self.data_bytes = position
        described = self.data_start + position
        if described > size:
            raise truncated(path, described - size)
        if described < size:
            raise appended(path)
        self.integrity = self.meta.get(digest.KEY)
        self.whole: Any = None  # a hasher every byte goes through (records written before)
        self.legacy: digest.LegacyBlocks | None = None
        if expected is not None and expected.startswith(f"{digest.TREE}:"):
            pass  # the header bytes matched the manifest (check_header)
        elif expected is not None:
            self.expected_sha256 = expected.removeprefix(f"{digest.LEGACY_FILE}:")
            self.whole = hashlib.sha256(self.head)
        elif self.integrity is None and digest.LEGACY_KEY in self.meta:
            self.legacy = digest.LegacyBlocks()
        if self.integrity is not None and self.whole is None:
            recorded = self.integrity.get("sections") if isinstance(self.integrity, dict) else None
            if (
                not isinstance(recorded, dict)
                or self.integrity.get("algorithm") != digest.ALGORITHM
            ):
                raise unreadable(path, f"its integrity block is {self.integrity!r}")
            self.recorded: dict[str, str] = recorded

    # -- the sections read -------------------------------------------------------------------
    def section_names(self) -> list[str]:
        return sorted({t.section for t in self.tensors})

    def _plan(
        self, sections: Collection[str] | None
    ) -> tuple[list[Tensor], Callable[[Tensor], bool]]:
        """The tensors to read (in file order) and which of them the caller wants. A record
        checked as a whole (written before sections) is read whole."""
        wanted: Callable[[Tensor], bool] = (
            (lambda t: True) if sections is None else (lambda t: t.section in sections)
        )
        if self.whole is not None or self.legacy is not None:
            return self.tensors, wanted
        return [t for t in self.tensors if wanted(t)], wanted

    def _start(self) -> digest.Sections:
        """Fresh hashers for one pass over the file (a record may be read twice)."""
        if self.whole is not None:
            self.whole = hashlib.sha256(self.head)
        if self.legacy is not None:
            self.legacy = digest.LegacyBlocks()
        return digest.Sections()

    def _hash(self, sums: digest.Sections, t: Tensor, view: Any) -> None:
        if self.whole is not None:
            self.whole.update(view)
        elif self.legacy is not None:
            self.legacy.update(view)
        elif self.integrity is not None:
            sums.update(t.section, view)

    def _check(self, sums: digest.Sections, read: list[Tensor]) -> None:
        """Compare what was read with what the header (or the manifest) recorded."""
        path = self.path
        if self.whole is not None:
            if (actual := self.whole.hexdigest()) != self.expected_sha256:
                raise CheckpointCorrupt(
                    f"Checkpoint {str(path)!r} is corrupt: its sha256 is {actual[:16]}..., the "
                    f"manifest recorded {self.expected_sha256[:16]}... when it was written. Load "
                    "another checkpoint (read_manifest lists them) or restore this file from a "
                    "backup."
                )
            return
        if self.legacy is not None:
            recorded = str(self.meta[digest.LEGACY_KEY])
            if (actual := self.legacy.value()) != recorded:
                raise CheckpointCorrupt(
                    f"Checkpoint {str(path)!r} is corrupt: its tensor bytes digest to "
                    f"{digest.short(actual)}, its header recorded {digest.short(recorded)} when "
                    "it was written. Load another checkpoint or restore this file from a backup."
                )
            return
        if self.integrity is None:
            return
        found = sums.hexdigests()
        for section in sorted({t.section for t in read}):
            actual = found.get(section, digest.of_empty())
            listed = self.recorded.get(section)
            if actual != listed:
                raise CheckpointCorrupt(
                    f"Checkpoint {str(path)!r} is corrupt: its {section!r} section digests to "
                    f"{digest.ALGORITHM}:{actual[:16]}..., its header recorded "
                    f"{digest.ALGORITHM}:{str(listed)[:16]}... when it was written. Load "
                    "another checkpoint or restore this file from a backup."
                )

    # -- reading -------------------------------------------------------------------------------
    def _mapped(self) -> tuple[torch.Tensor, memoryview]:
        """The whole file, as one uint8 tensor and as bytes, over a private mapping of it:
        tensors made from it are the file's pages, read (and copied on write) only when
        touched."""
        if self.map is None:
            self.map = mmap.mmap(
                self.fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        return torch.frombuffer(self.map, dtype=torch.uint8), memoryview(self.map)

    def read(self, sections: Collection[str] | None = None) -> dict[str, torch.Tensor]:
        """The wanted sections' tensors (every tensor without ``sections``), made straight
        from the file's mapped pages (no copy; a tensor under 64 KiB gets its own storage),
        and verified before they are returned."""
        todo, wanted = self._plan(sections)
        self._advise(todo, getattr(mmap, "MADV_SEQUENTIAL", 0))
        sums = self._start()
        out: dict[str, torch.Tensor] = {}
        base, pages = (
            self._mapped() if todo else (torch.empty(0, dtype=torch.uint8), memoryview(b""))
        )
        for t in todo:
            if t.size == 0:
                continue
            at = self.data_start + t.begin
            for start in range(at, at + t.size, _PIECE):  # hashed piece by piece, while cached
                self._ahead(start, todo)
                self._hash(sums, t, pages[start : min(start + _PIECE, at + t.size)])
            if wanted(t):
                raw = base[at : at + t.size]
                if t.size < _OWN or at % _element_size(t.dtype):
                    raw = raw.clone()  # small (RNG state, counters) or misaligned: its own
                out[t.name] = raw.view(t.dtype).view(t.shape)
        for t in todo:
            if t.size == 0 and wanted(t):
                out[t.name] = torch.empty(t.shape, dtype=t.dtype)
        del pages
        self._check(sums, todo)
        return out

    def stream(
        self,
        sections: Collection[str] | None = None,
        piece_bytes: int = _PIECE,
        hasher: Executor | None = None,
    ) -> Iterator[tuple[Tensor, int, torch.Tensor]]:
        """Yield ``(tensor, first element, flat piece)`` for the wanted sections' tensors in
        file order, in pieces of at most ``piece_bytes`` (4 MiB), each read (``preadv``) into
        one of two buffers the stream reuses: a piece is meant to be used before the next
        one is yielded, and it is still in the CPU's cache from the read when it is used.
        A consumer that folds the pieces into something else (the averaging sum) so holds
        nothing of the file but those buffers. A corrupt section raises after its last piece,
        so a consumer must exhaust the iterator before trusting what it built.

        Why reads and not the mapping :meth:`read` uses: a piece read from the disk through
        a mapping costs a page fault per few pages and the unmapping behind it; one
        ``preadv`` per piece is cheaper, and the kernel reads ahead of a file read in order
        (measured in ``bench/averaging.py``, cold: 1.1x the plain read against 1.4x).

        ``hasher`` (an executor, for a caller with a core to spare) reads and hashes the next
        piece, into the other buffer, while the caller uses this one; a stream asks for piece
        ``i + 1`` only once piece ``i`` is done, which keeps each section's hash in file
        order, and one worker may serve several streams read side by side."""
        todo, wanted = self._plan(sections)
        sums = self._start()
        plan = list(_pieces(todo, self.data_start, piece_bytes))
        buffers = [torch.empty(max(piece_bytes, 16), dtype=torch.uint8) for _ in range(2)]
        views = [b.numpy().data.cast("B") for b in buffers]

        def fetch(i: int) -> None:
            """Read the ``i``-th piece into its buffer and hash it."""
            t, start, n, _ = plan[i]
            if n:
                self._pread_into(views[i % 2][:n], start)
                self._hash(sums, t, views[i % 2][:n])

        ahead = hasher.submit(fetch, 0) if hasher is not None and plan else None
        try:
            for i, (t, _, n, first) in enumerate(plan):
                if hasher is None:
                    fetch(i)
                else:  # the next piece is read and hashed while the caller uses this one
                    assert ahead is not None
                    ahead.result()
                    ahead = hasher.submit(fetch, i + 1) if i + 1 < len(plan) else None
                if wanted(t):
                    yield t, first, buffers[i % 2][:n].view(t.dtype)
        finally:  # closed early: the job in flight ends before the file or a new pass moves on
            if ahead is not None and not ahead.cancel():
                ahead.exception()
        self._check(sums, todo)

    def _pread_into(self, view: memoryview, offset: int) -> None:
        """Fill ``view`` from the file at ``offset``; a short read means the file shrank
        since its size was checked."""
        got = 0
        try:
            while got < len(view) and (k := os.preadv(self.fd, [view[got:]], offset + got)):
                got += k
            size = os.fstat(self.fd).st_size
        except OSError as exc:
            raise unreadable(self.path, exc) from exc
        if got < len(view):
            raise truncated(self.path, max(1, self.data_start + self.data_bytes - size))

    def _ahead(self, at: int, todo: list[Tensor]) -> None:
        """Keep the kernel reading ``_AHEAD`` bytes past ``at`` (file offsets) of the ranges
        still to read, in the order they are read, asked of the read-ahead thread
        (:mod:`nitro_core.store.readahead`): the disk works while this thread hashes and its
        caller uses what is read."""
        if at + _AHEAD // 2 < self.advised:
            return
        assert self.map is not None
        until = at + _AHEAD
        for run in _runs(todo):
            begin = max(self.data_start + run[0].begin, self.advised)
            end = min(self.data_start + run[-1].end, until)
            if begin < end:
                aligned = begin - begin % mmap.PAGESIZE
                if readahead.AVAILABLE:  # the kernel reads it while this thread goes on
                    readahead.request(self.fd, aligned, end - aligned)
                else:
                    self.map.madvise(mmap.MADV_WILLNEED, aligned, end - aligned)
        self.advised = until

    def verify(self) -> None:
        """Hash every section (every byte) against the header, or the manifest."""
        for _ in self.stream():
            pass

    def prefetch(self, sections: Collection[str] | None = None) -> None:
        """Ask the kernel to read the wanted sections into the page cache now."""
        todo = self._plan(sections)[0]
        if hasattr(os, "posix_fadvise"):
            for run in _runs(todo):
                length = run[-1].end - run[0].begin
                os.posix_fadvise(
                    self.fd, self.data_start + run[0].begin, length, os.POSIX_FADV_WILLNEED
                )

    def _advise(self, todo: list[Tensor], advice: int) -> None:
        """``madvise`` the mapped ranges of ``todo`` (read ahead: they are read in order)."""
        if not advice or not todo:
            return
        self._mapped()
        assert self.map is not None
        for run in _runs(todo):
            begin = self.data_start + run[0].begin
            aligned = begin - begin % mmap.PAGESIZE
            self.map.madvise(advice, aligned, self.data_start + run[-1].end - aligned)

    def close(self) -> None:
        """Close the file; its mapping lives on while a tensor made from it does."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.map = None

    def __enter__(self) -> RecordFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pieces(
    tensors: list[Tensor], data_start: int, piece_bytes: int
) -> Iterator[tuple[Tensor, int, int, int]]:
    """``(tensor, file offset, bytes, first element)`` of each piece of ``tensors`` in file
    order, at most ``piece_bytes`` each and a whole number of elements (an empty tensor is
    one piece of no bytes)."""
    for t in tensors:
        if t.size == 0:
            yield t, data_start + t.begin, 0, 0
            continue
        width = _element_size(t.dtype)
        step = max(width, piece_bytes - piece_bytes % width)
        at = data_start + t.begin
        for start in range(at, at + t.size, step):
            yield t, start, min(step, at + t.size - start), (start - at) // width


def _runs(tensors: list[Tensor]) -> Iterator[list[Tensor]]:
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


def _element_size(dtype: torch.dtype) -> int:
    return dtype.itemsize


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


def prefetch(path: Path, sections: Collection[str] | None = None) -> None:
    """Ask the kernel to start reading ``path`` (its wanted sections) into the page cache
    now, so that a later read overlaps its disk time with the work done before it."""
    try:
        with RecordFile(path) as record:
            record.prefetch(sections)
    except (OSError, CheckpointCorrupt, CheckpointMissing):
        return  # the reader will report it
