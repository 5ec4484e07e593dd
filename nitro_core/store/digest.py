"""The tensor digest every record carries in its header (``tensor_digest``), so that a record
no manifest lists (a saved average, an export) is checked when it is loaded.

It covers the data section (the tensor bytes, in file order), cut into consecutive 8 MiB
blocks: ``sha256(sha256(block 0) || sha256(block 1) || ...)``, written as
``"sha256-8MiB-blocks:<hex>"``. Blocks hash independently, so the writer, which must
know the digest before it writes the header that precedes the data, hashes them on every
core at once instead of adding a sequential pass to each write; a reader folds the bytes in
as they stream past, in one pass. To check a record by hand: split the bytes after its
header into 8 MiB pieces, sha256 each, and sha256 the concatenated 32-byte digests.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

KEY = "tensor_digest"  # in the ``nitro`` header
ALGORITHM = "sha256-8MiB-blocks"
BLOCK = 8 * 1024 * 1024


def of_views(views: Iterable[Any]) -> str:
    """The digest of the bytes ``views`` yield in order (memoryviews or bytes), hashing
    the blocks on a pool of threads (hashlib releases the GIL on large buffers)."""
    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(_hash_block, _blocks_of(views)))
    return _fold(digests)


class Folder:
    """The digest of bytes fed in order with :meth:`update` (a reader's way: one pass)."""

    def __init__(self) -> None:
        self.digests: list[bytes] = []
        self.block = hashlib.sha256()
        self.filled = 0

    def update(self, view: Any) -> None:
        view = memoryview(view).cast("B")
        while len(view):
            take = min(len(view), BLOCK - self.filled)
            self.block.update(view[:take])
            self.filled += take
            view = view[take:]
            if self.filled == BLOCK:
                self.digests.append(self.block.digest())
                self.block, self.filled = hashlib.sha256(), 0

    def value(self) -> str:
        digests = self.digests + ([self.block.digest()] if self.filled else [])
        return _fold(digests)


def _blocks_of(views: Iterable[Any]) -> Iterator[list[memoryview]]:
    """The bytes of ``views`` regrouped into BLOCK-sized lists of slices (no copies)."""
    block: list[memoryview] = []
    filled = 0
    for view in views:
        view = memoryview(view).cast("B")
        while len(view):
            take = min(len(view), BLOCK - filled)
            block.append(view[:take])
            filled += take
            view = view[take:]
            if filled == BLOCK:
                yield block
                block, filled = [], 0
    if filled:
        yield block


def _hash_block(pieces: list[memoryview]) -> bytes:
    sha = hashlib.sha256()
    for piece in pieces:
        sha.update(piece)
    return sha.digest()


def _fold(digests: list[bytes]) -> str:
    return f"{ALGORITHM}:{hashlib.sha256(b''.join(digests)).hexdigest()}"
