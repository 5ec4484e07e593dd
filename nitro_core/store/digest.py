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

The header's own digest, so that a record no manifest lists (an average, an export, a file
copied out of its run) still detects an edited header: the ``integrity`` block is the first
key of the ``nitro`` metadata and opens with ``"header": "<32 hex>"``, the xxh3-128 of the
file's first ``8 + N`` bytes with those 32 hex digits written as zeros. It sits at a fixed
offset (:data:`HEADER_SLOT`), so a reader checks it from the header bytes without parsing
them, and it covers every header byte (the tensor table too, not only the metadata). A record
directory's ``header.json`` carries the same ``integrity.header``: the xxh3-128 of its
canonical JSON (``json.dumps(..., sort_keys=True)``, as it is written) with that value zeroed.
A header without one is not checked this way only when it says it was written before header
digests (``format_version`` 1, or none: :func:`requires_header_digest`); one that claims a later
format and carries none (its ``integrity`` key renamed or removed, its block moved) is refused,
so one changed byte cannot turn the check off. A listed record's header is checked against the
manifest either way.

Records written before: their header carries ``tensor_digest`` (``"sha256-8MiB-blocks:<hex>"``,
sha256 over the sha256 of each 8 MiB block of the data section) and their manifest entry the
``sha256`` of the whole file; :class:`LegacyBlocks` and ``hashlib.sha256`` still check them.
"""

from __future__ import annotations

import hashlib
import json
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


# the bytes that open a record's header: 8-byte length, then this, then the header digest
HEADER_SLOT = b'{"__metadata__":{"nitro":"{\\"integrity\\":{\\"header\\":\\"'
# the first record format whose headers carry their own digest (records.FORMAT_VERSION): a
# header that claims it or a later one and carries none was edited, never written that way
HEADER_DIGEST_SINCE = 2


def requires_header_digest(meta: dict[str, Any]) -> bool:
    """Whether a record's ``nitro`` metadata claims a format that carries a header digest:
    any ``format_version`` but none (a foreign safetensors file) or an integer below
    :data:`HEADER_DIGEST_SINCE` (a record written before header digests)."""
    version = meta.get("format_version")
    return not (version is None or (type(version) is int and version < HEADER_DIGEST_SINCE))


def is_sealed(head: bytes) -> bool:
    """Whether a record's first ``8 + N`` bytes open with the header-digest slot."""
    return head.startswith(HEADER_SLOT, 8)


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
    """The header's ``integrity`` block (its header digest zeroed: :func:`seal` fills it)."""
    return {
        "header": _PLACEHOLDER,
        "algorithm": ALGORITHM,
        "data_bytes": data_bytes,
        "sections": dict(sorted(sections.items())),
    }


def placeholder(names: Iterable[str], data_bytes: int) -> dict[str, Any]:
    """An ``integrity`` block of the final one's length, written first and replaced once the
    data is written (every digest is 32 hex digits, so the header keeps its size)."""
    return block({name: _PLACEHOLDER for name in names}, data_bytes)


def seal(head: bytes) -> bytes:
    """``head`` (a record's first ``8 + N`` bytes, its header digest zeroed at
    :data:`HEADER_SLOT`) with its header digest written in."""
    at = 8 + len(HEADER_SLOT)
    assert head[8:at] == HEADER_SLOT and head[at : at + _HEX] == _PLACEHOLDER.encode()
    return head[:at] + xxhash.xxh3_128(head).hexdigest().encode() + head[at + _HEX :]


def header_check(head: bytes) -> tuple[str, str] | None:
    """``(recorded, actual)`` header digests of a record's first ``8 + N`` bytes, or None for
    a header that carries none (written before header digests)."""
    at = 8 + len(HEADER_SLOT)
    if head[8:at] != HEADER_SLOT:
        return None
    recorded = head[at : at + _HEX]
    zeroed = head[:at] + _PLACEHOLDER.encode() + head[at + _HEX :]
    return recorded.decode("ascii", "replace"), str(xxhash.xxh3_128(zeroed).hexdigest())


def json_header_check(header: dict[str, Any]) -> tuple[str, str] | None:
    """``(recorded, actual)`` header digests of a record directory's parsed ``header.json``,
    or None when it carries none (written before header digests)."""
    block = header.get(KEY)
    if not isinstance(block, dict) or "header" not in block:
        return None
    zeroed = {**header, KEY: {**block, "header": _PLACEHOLDER}}
    return str(block["header"]), json_header_digest(zeroed)


def json_header_digest(header: dict[str, Any]) -> str:
    """The xxh3-128 of ``header`` as ``header.json`` holds it (keys sorted)."""
    return str(xxhash.xxh3_128(json.dumps(header, sort_keys=True).encode()).hexdigest())


def sealed_json_header(header: dict[str, Any]) -> bytes:
    """``header.json``'s bytes: ``header`` with an ``integrity`` block naming its digest."""
    block = {"algorithm": ALGORITHM, "header": _PLACEHOLDER}
    sealed = {**header, KEY: {**block, "header": json_header_digest({**header, KEY: block})}}
    return json.dumps(sealed, sort_keys=True).encode()


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
