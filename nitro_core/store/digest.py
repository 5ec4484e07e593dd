"""The digests that say what a record's bytes must hash to: one per section in its header, one
for the whole file in the manifest.

A record's tensors fall into *sections* by name: the text before the first ``/`` (``params``,
``buffers``, ``optim``, ``ema``, ``rng``; each shard file of a sharded record carries its own),
or ``tensors`` for a name without one (an export's plain state-dict keys). The header's
``integrity`` block holds, per section, the xxh3-128 of that section's tensor bytes
concatenated in file order, and the length of the data section::

    "integrity": {"algorithm": "xxh3-128", "data_bytes": 301989888,
                  "sections": {"buffers": "<32 hex>", "optim": "<32 hex>", "params": "..."}}

so a reader hashes exactly the sections it reads (averaging never touches ``optim``). The
manifest's ``digest`` of a record, ``"xxh3-128-tree:<32 hex>"``, is the xxh3-128 of the file's
first ``8 + N`` bytes (the header length and the JSON header): since the header names every
section's digest, that one value covers every byte of the file (a hash tree of depth two),
and the writer has it without a second pass over the data. To check a record by hand: hash
the header bytes and compare with the manifest; hash each section's tensor bytes in file
order and compare with the header.

Why xxh3-128 (``xxhash``): measured by ``bench/digests.py`` on the development machine (2
shared cores), xxh3-128 hashes at 6-7 GB/s on one core, BLAKE3 at 3.5-4 GB/s on one core (its
multi-threaded mode would take cores the caller's torch threads own) and sha256 at 1.2 GB/s,
against a disk that writes at about 1 GB/s. The threat is accidental corruption (bit rot,
torn or truncated writes, a swapped file), which a 128-bit non-cryptographic hash detects;
whoever can rewrite a record can rewrite the manifest beside it too.

Records written before: their header carries ``tensor_digest`` (``"sha256-8MiB-blocks:<hex>"``,
sha256 over the sha256 of each 8 MiB block of the data section) and their manifest entry the
``sha256`` of the whole file; :class:`LegacyBlocks` and ``hashlib.sha256`` still check them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import xxhash

KEY = "integrity"  # in the ``nitro`` header
ALGORITHM = "xxh3-128"
TREE = "xxh3-128-tree"  # the manifest's whole-file digest: xxh3-128 of the header bytes
LEGACY_KEY = "tensor_digest"  # headers written before sections: sha256 of 8 MiB blocks
LEGACY_ALGORITHM = "sha256-8MiB-blocks"
LEGACY_FILE = "sha256"  # manifest entries written before: sha256 of the whole file
BLOCK = 8 * 1024 * 1024
_HEX = 32
_PLACEHOLDER = "0" * _HEX


def section_of(name: str) -> str:
    """The section a tensor name belongs to: ``params/0.weight`` -> ``params``."""
    head, slash, _ = name.partition("/")
    return head if slash else "tensors"


class Sections:
    """Running xxh3-128 digests, one per section, fed in file order."""

    def __init__(self) -> None:
        self.hashers: dict[str, Any] = {}

    def update(self, section: str, view: Any) -> None:
        hasher = self.hashers.get(section)
        if hasher is None:
            hasher = self.hashers[section] = xxhash.xxh3_128()
        hasher.update(view)

    def hexdigests(self) -> dict[str, str]:
        return {name: h.hexdigest() for name, h in sorted(self.hashers.items())}


def block(sections: dict[str, str], data_bytes: int) -> dict[str, Any]:
    """The header's ``integrity`` block."""
    return {
        "algorithm": ALGORITHM,
        "data_bytes": data_bytes,
        "sections": dict(sorted(sections.items())),
    }


def placeholder(names: Iterable[str], data_bytes: int) -> dict[str, Any]:
    """An ``integrity`` block of the final one's length, written first and replaced once the
    data is written (every digest is 32 hex digits, so the header keeps its size)."""
    return block({name: _PLACEHOLDER for name in names}, data_bytes)


def of_empty() -> str:
    return str(xxhash.xxh3_128().hexdigest())


def tree(header_bytes: Any) -> str:
    """The manifest's digest of a record whose first ``8 + N`` bytes are ``header_bytes``."""
    return f"{TREE}:{xxhash.xxh3_128(header_bytes).hexdigest()}"


def short(digest: str) -> str:
    """``algorithm:<first 16 hex>...`` for messages."""
    algorithm, _, hexdigest = str(digest).partition(":")
    return f"{algorithm}:{hexdigest[:16]}..."


class LegacyBlocks:
    """The ``tensor_digest`` of bytes fed in order (records written before sections)."""

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
        return f"{LEGACY_ALGORITHM}:{hashlib.sha256(b''.join(digests)).hexdigest()}"
