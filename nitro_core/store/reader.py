"""Reading a record file: :class:`RecordFile`, an open record, its header parsed once and
checked, read in whichever of two ways its caller needs, exactly the sections read verified.

Opening (never through a link) parses and checks the header
(:mod:`~nitro_core.store.record_header`) and settles what the bytes read are checked against
(:mod:`~nitro_core.store.section_check`: the header's section digests, or a record written
before sections hashed whole). Then:

- :meth:`RecordFile.read` (resume, weights) makes each wanted tensor a view of its bytes in
  a private mapping of the file, no copy, the kernel kept reading ahead
  (:mod:`~nitro_core.store.mapped_read`);
- :meth:`RecordFile.stream` (averaging) reads the wanted sections in pieces of a few MiB
  into two reused buffers (:mod:`~nitro_core.store.streamed_read`);
- :meth:`RecordFile.verify` hashes every section (``nitro verify``);
- :meth:`RecordFile.prefetch`, and :func:`prefetch` by name, ask the kernel for whole
  sections at once, so that a later read overlaps its disk time with the work before it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING

from nitro_core.errors import CheckpointCorrupt, CheckpointMissing
from nitro_core.store.record_header import Tensor, open_record, parse, runs
from nitro_core.store.section_check import PIECE, SectionCheck
from nitro_core.store.streamed_read import StreamedReads

if TYPE_CHECKING:  # tensors; torch loads with the first read (verify hashes without it)
    import torch

    from nitro_core.store.mapped_read import MappedReads


class RecordFile:
    """An open record, its header parsed once and checked against the file's size and, with
    ``expected`` (the manifest's digest: ``xxh3-128-tree:<hex>``, or ``sha256:<hex>`` of an
    entry written before), against the manifest."""

    def __init__(self, path: Path, expected: str | None = None) -> None:
        self.path = Path(path)
        self.fd = open_record(self.path)
        try:
            self.header = parse(self.fd, self.path, expected)
            check = SectionCheck(self.path, self.header, expected)
        except BaseException:
            os.close(self.fd)
            raise
        self.meta = self.header.meta
        self.tensors = self.header.tensors
        self.data_start = self.header.data_start
        self._mapped: MappedReads | None = None  # made by the first read
        self._streamed = StreamedReads(self.fd, self.path, self.header, check)
        self._check = check

    def section_names(self) -> list[str]:
        return self.header.section_names()

    def read(self, sections: Collection[str] | None = None) -> dict[str, torch.Tensor]:
        """The wanted sections' tensors (every tensor without ``sections``), made straight
        from the file's mapped pages, verified before they are returned
        (:meth:`MappedReads.read`)."""
        if self._mapped is None:
            from nitro_core.store.mapped_read import MappedReads  # lazy: it imports torch

            self._mapped = MappedReads(self.fd, self.header, self._check)
        return self._mapped.read(sections)

    def stream(
        self,
        sections: Collection[str] | None = None,
        piece_bytes: int = PIECE,
        hasher: Executor | None = None,
    ) -> Iterator[tuple[Tensor, int, torch.Tensor]]:
        """``(tensor, first element, flat piece)`` for the wanted sections' tensors in file
        order, each piece in one of two reused buffers; a corrupt section raises after its
        last piece (:meth:`StreamedReads.stream`)."""
        return self._streamed.stream(sections, piece_bytes, hasher)

    def verify(self) -> None:
        """Hash every section (every byte) against the header, or the manifest."""
        self._streamed.verify()

    def prefetch(self, sections: Collection[str] | None = None) -> None:
        """Ask the kernel to read the wanted sections into the page cache now."""
        todo = self._check.plan(sections)[0]
        if hasattr(os, "posix_fadvise"):
            for run in runs(todo):
                length = run[-1].end - run[0].begin
                os.posix_fadvise(
                    self.fd, self.data_start + run[0].begin, length, os.POSIX_FADV_WILLNEED
                )

    def close(self) -> None:
        """Close the file; its mapping lives on while a tensor made from it does."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._mapped is not None:
            self._mapped.close()
        self._streamed.close()

    def __enter__(self) -> RecordFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def prefetch(path: Path, sections: Collection[str] | None = None) -> None:
    """Ask the kernel to start reading ``path`` (its wanted sections) into the page cache
    now, so that a later read overlaps its disk time with the work done before it."""
    try:
        with RecordFile(path) as record:
            record.prefetch(sections)
    except (OSError, CheckpointCorrupt, CheckpointMissing):
        return  # the reader will report it
