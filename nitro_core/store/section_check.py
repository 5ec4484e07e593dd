"""Checking the bytes a read of a record file went through against what was recorded when
the record was written (:mod:`nitro_core.store.digest`).

A record carries a digest per section in its header, and a read hashes exactly the sections
it reads (averaging never touches ``optim``). A record written before sections carries
``tensor_digest`` (sha256 of 8 MiB blocks of the data) and its manifest entry the ``sha256``
of the whole file: such a record is hashed whole, every byte as before, whatever sections
are wanted.

One :class:`SectionCheck` per open record says which tensors a pass must read to check what
it wants (:meth:`~SectionCheck.plan`); each pass over the file (a record may be read twice)
starts fresh hashers (:meth:`~SectionCheck.start`), puts every piece it reads through them in
file order (:meth:`~SectionCheck.hash`, a piece at a time while it is in the CPU's cache)
and compares them at its end (:meth:`~SectionCheck.check`), which raises on a mismatch
before the caller may trust what it read. Hashing runs on whichever thread calls ``hash``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from nitro_core.errors import CheckpointCorrupt, Lister
from nitro_core.store import digest
from nitro_core.store.record_header import Header, Tensor, unreadable

PIECE = 4 * 1024 * 1024  # bytes hashed (while cached) per call; a streamed piece


class SectionCheck:
    """The digests one record file is checked against: its header's per section, or, for a
    record written before sections, the manifest's ``sha256`` of the file (``expected``) or
    the header's ``tensor_digest`` of the data."""

    def __init__(self, path: Path, header: Header, expected: str | None) -> None:
        self.path = path
        self.header = header
        self.integrity = header.meta.get(digest.KEY)
        self.whole: Any = None  # a hasher every byte goes through (records written before)
        self.legacy: digest.LegacyBlocks | None = None
        if expected is not None and expected.startswith(f"{digest.TREE}:"):
            pass  # the header bytes matched the manifest (check_header)
        elif expected is not None:
            self.expected_sha256 = expected.removeprefix(f"{digest.LEGACY_FILE}:")
            self.whole = hashlib.sha256(header.head)
        elif self.integrity is None and digest.LEGACY_KEY in header.meta:
            self.legacy = digest.LegacyBlocks()
        if self.integrity is not None and self.whole is None:
            recorded = self.integrity.get("sections") if isinstance(self.integrity, dict) else None
            if (
                not isinstance(recorded, dict)
                or self.integrity.get("algorithm") != digest.ALGORITHM
            ):
                raise unreadable(path, f"its integrity block is {self.integrity!r}")
            self.recorded: dict[str, str] = recorded

    def plan(
        self, sections: Collection[str] | None
    ) -> tuple[list[Tensor], Callable[[Tensor], bool]]:
        """The tensors to read (in file order) and which of them the caller wants. A record
        checked as a whole (written before sections) is read whole."""
        wanted: Callable[[Tensor], bool] = (
            (lambda t: True) if sections is None else (lambda t: t.section in sections)
        )
        if self.whole is not None or self.legacy is not None:
            return self.header.tensors, wanted
        return [t for t in self.header.tensors if wanted(t)], wanted

    def start(self) -> digest.Sections:
        """Fresh hashers for one pass over the file (a record may be read twice)."""
        if self.whole is not None:
            self.whole = hashlib.sha256(self.header.head)
        if self.legacy is not None:
            self.legacy = digest.LegacyBlocks()
        return digest.Sections()

    def hash(self, sums: digest.Sections, t: Tensor, view: Any) -> None:
        """Put the next piece read, of tensor ``t``, through this pass's hashers."""
        if self.whole is not None:
            self.whole.update(view)
        elif self.legacy is not None:
            self.legacy.update(view)
        elif self.integrity is not None:
            sums.update(t.section, view)

    def check(self, sums: digest.Sections, read: list[Tensor]) -> None:
        """Compare what was read with what the header (or the manifest) recorded."""
        path = self.path
        if self.whole is not None:
            if (actual := self.whole.hexdigest()) != self.expected_sha256:
                raise CheckpointCorrupt(
                    f"Checkpoint {str(path)!r} is corrupt: its sha256 is {actual[:16]}..., the "
                    f"manifest recorded {self.expected_sha256[:16]}... when it was written. Load "
                    "another checkpoint (",
                    Lister(str(path.parent)),
                    " lists them) or restore this file from a backup.",
                )
            return
        if self.legacy is not None:
            recorded = str(self.header.meta[digest.LEGACY_KEY])
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
