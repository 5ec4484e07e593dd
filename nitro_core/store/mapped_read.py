"""Zero-copy reads of a record file (resume, weights): each wanted tensor a view of its bytes
in a private memory mapping of the file, verified before it is returned.

The mapping's pages are read on first touch and copied only when written, so a tensor costs
no copy (one under 64 KiB gets its own storage: RNG states, counters). The sections read
are hashed piece by piece while each piece is cached (:mod:`nitro_core.store.section_check`),
on the caller's thread: a reader adds no computing thread the caller did not give it. The
kernel reads ahead: :class:`MappedReads` keeps it 8 MiB ahead of itself in the ranges it
still wants, asked of one read-ahead thread that only waits on the disk
(:mod:`nitro_core.store.readahead`), so the disk works while the caller computes.

Records are never modified once published (a writer renames a new file into place, and
retention only unlinks), which is what lets tensors live on a record's pages.
"""

from __future__ import annotations

import mmap
from collections.abc import Collection

import torch

from nitro_core.store import readahead
from nitro_core.store.record_header import Header, Tensor, runs
from nitro_core.store.section_check import PIECE, SectionCheck

_OWN = 64 * 1024  # tensors under this get their own storage, not a view of the mapping
_AHEAD = 8 * 1024 * 1024  # bytes a reader keeps the kernel reading ahead of itself


class MappedReads:
    """Tensors made from the pages of the record open at ``fd``, checked by ``check``."""

    def __init__(self, fd: int, header: Header, check: SectionCheck) -> None:
        self.fd = fd
        self.header = header
        self.check = check
        self.map: mmap.mmap | None = None
        self.advised = 0  # file offset up to which the kernel was asked to read ahead

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
        todo, wanted = self.check.plan(sections)
        self._advise(todo, getattr(mmap, "MADV_SEQUENTIAL", 0))
        sums = self.check.start()
        out: dict[str, torch.Tensor] = {}
        data_start = self.header.data_start
        base, pages = (
            self._mapped() if todo else (torch.empty(0, dtype=torch.uint8), memoryview(b""))
        )
        for t in todo:
            if t.size == 0:
                continue
            at = data_start + t.begin
            for start in range(at, at + t.size, PIECE):  # hashed piece by piece, while cached
                self._ahead(start, todo)
                self.check.hash(sums, t, pages[start : min(start + PIECE, at + t.size)])
            if wanted(t):
                raw = base[at : at + t.size]
                if t.size < _OWN or at % t.itemsize:
                    raw = raw.clone()  # small (RNG state, counters) or misaligned: its own
                out[t.name] = raw.view(t.dtype).view(t.shape)
        for t in todo:
            if t.size == 0 and wanted(t):
                out[t.name] = torch.empty(t.shape, dtype=t.dtype)
        del pages
        self.check.check(sums, todo)
        return out

    def _ahead(self, at: int, todo: list[Tensor]) -> None:
        """Keep the kernel reading ``_AHEAD`` bytes past ``at`` (file offsets) of the ranges
        still to read, in the order they are read, asked of the read-ahead thread
        (:mod:`nitro_core.store.readahead`): the disk works while this thread hashes and its
        caller uses what is read."""
        if at + _AHEAD // 2 < self.advised:
            return
        assert self.map is not None
        data_start, until = self.header.data_start, at + _AHEAD
        for run in runs(todo):
            begin = max(data_start + run[0].begin, self.advised)
            end = min(data_start + run[-1].end, until)
            if begin < end:
                aligned = begin - begin % mmap.PAGESIZE
                if readahead.AVAILABLE:  # the kernel reads it while this thread goes on
                    readahead.request(self.fd, aligned, end - aligned)
                else:
                    self.map.madvise(mmap.MADV_WILLNEED, aligned, end - aligned)
        self.advised = until

    def _advise(self, todo: list[Tensor], advice: int) -> None:
        """``madvise`` the mapped ranges of ``todo`` (read ahead: they are read in order)."""
        if not advice or not todo:
            return
        self._mapped()
        assert self.map is not None
        for run in runs(todo):
            begin = self.header.data_start + run[0].begin
            aligned = begin - begin % mmap.PAGESIZE
            self.map.madvise(advice, aligned, self.header.data_start + run[-1].end - aligned)

    def close(self) -> None:
        """The file was closed; the mapping lives on while a tensor made from it does."""
        self.fd = -1
        self.map = None
