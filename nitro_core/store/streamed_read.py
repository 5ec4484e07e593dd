"""Streamed reads of a record file (averaging, ``nitro verify``): the wanted sections'
tensors read with ``preadv``, not through a mapping, in pieces of a few MiB into two reused
buffers, each piece hashed as it is read (:mod:`nitro_core.store.section_check`).

A reader that folds the pieces into something else (the averaging sum) so holds nothing of
the file but those buffers. The kernel's own read-ahead serves reads in file order; a caller
with a core to spare passes a one-thread executor that reads and hashes the next piece
meanwhile, else everything runs on the caller's thread.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING

from nitro_core.store.record_header import Header, Tensor, truncated, unreadable
from nitro_core.store.section_check import PIECE, SectionCheck

if TYPE_CHECKING:  # the pieces' type; torch loads with the first stream
    import torch


class StreamedReads:
    """Pieces of the record open at ``fd``, read into reused buffers and checked by
    ``check``."""

    def __init__(self, fd: int, path: Path, header: Header, check: SectionCheck) -> None:
        self.fd = fd
        self.path = path
        self.header = header
        self.check = check

    def stream(
        self,
        sections: Collection[str] | None = None,
        piece_bytes: int = PIECE,
        hasher: Executor | None = None,
    ) -> Iterator[tuple[Tensor, int, torch.Tensor]]:
        """Yield ``(tensor, first element, flat piece)`` for the wanted sections' tensors in
        file order, in pieces of at most ``piece_bytes`` (4 MiB), each read (``preadv``) into
        one of two buffers the stream reuses: a piece is meant to be used before the next
        one is yielded, and it is still in the CPU's cache from the read when it is used.
        A corrupt section raises after its last piece, so a consumer must exhaust the
        iterator before trusting what it built.

        Why reads and not a mapping (:mod:`~nitro_core.store.mapped_read`): a piece read from
        the disk through a mapping costs a page fault per few pages and the unmapping behind
        it; one ``preadv`` per piece is cheaper, and the kernel reads ahead of a file read in
        order (measured in ``bench/averaging.py``, cold: 1.1x the plain read against 1.4x).

        ``hasher`` (an executor, for a caller with a core to spare) reads and hashes the next
        piece, into the other buffer, while the caller uses this one; a stream asks for piece
        ``i + 1`` only once piece ``i`` is done, which keeps each section's hash in file
        order, and one worker may serve several streams read side by side."""
        import torch  # lazy: verify() hashes without it

        todo, wanted = self.check.plan(sections)
        sums = self.check.start()
        plan = list(_pieces(todo, self.header.data_start, piece_bytes))
        buffers = [torch.empty(max(piece_bytes, 16), dtype=torch.uint8) for _ in range(2)]
        views = [b.numpy().data.cast("B") for b in buffers]

        def fetch(i: int) -> None:
            """Read the ``i``-th piece into its buffer and hash it."""
            t, start, n, _ = plan[i]
            if n:
                self._pread_into(views[i % 2][:n], start)
                self.check.hash(sums, t, views[i % 2][:n])

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
        self.check.check(sums, todo)

    def verify(self, piece_bytes: int = PIECE) -> None:
        """Read and hash every section in pieces, as :meth:`stream` does, into a plain
        buffer: no tensor is made, so ``nitro verify`` checks a record without torch."""
        todo, _ = self.check.plan(None)
        sums = self.check.start()
        view = memoryview(bytearray(max(piece_bytes, 16)))
        for t, start, n, _ in _pieces(todo, self.header.data_start, piece_bytes):
            if n:
                self._pread_into(view[:n], start)
                self.check.hash(sums, t, view[:n])
        self.check.check(sums, todo)

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
            described = self.header.data_start + self.header.data_bytes
            raise truncated(self.path, max(1, described - size))

    def close(self) -> None:
        """The file was closed: a read from now on fails (``unreadable``)."""
        self.fd = -1


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
        width = t.itemsize
        step = max(width, piece_bytes - piece_bytes % width)
        at = data_start + t.begin
        for start in range(at, at + t.size, step):
            yield t, start, min(step, at + t.size - start), (start - at) // width
