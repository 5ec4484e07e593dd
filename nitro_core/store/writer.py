"""Writing a record: a standard safetensors file (8-byte little-endian header length, a JSON
header, the tensor bytes), written once, streamed from the host tensors, never held twice.

The header must precede the data, but its ``integrity`` block (:mod:`nitro_core.store.digest`)
names digests of that data. So the writer writes the header with placeholder digests of the
final length and streams the tensors (the memory copy into the page cache, at full speed:
nothing else reads memory meanwhile); then, while a helper thread waits for ``fdatasync`` to
put that data on the disk, it hashes the same host tensors; then it rewrites the header in
place, before the fsync that makes the file durable (which then has one page left to
write). The integrity block also names the digest of the header bytes themselves, so a record
no manifest lists still detects an edited header. The hash overlaps the disk's time instead of adding to the write's, and the helper
only waits on the disk. The manifest's digest of the file is the xxh3-128 of the final
header bytes.

Tensors are laid out largest element first, then by name, so every tensor starts at an
offset its element size divides (readers make tensors straight from the bytes) and each
section is a few contiguous runs.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from nitro_core.errors import RecordError
from nitro_core.store import digest
from nitro_core.store.record_header import CODES, META_KEY

FORMAT_KEY, FORMAT_PT = "format", "pt"  # what transformers' load_state_dict checks
_CHUNK = 8 * 1024 * 1024

# the dtypes a record stores, by their safetensors codes (record_header.CODES: one table)
DTYPES: dict[torch.dtype, str] = {getattr(torch, name): code for code, (name, _) in CODES.items()}
FROM_CODE = {code: dtype for dtype, code in DTYPES.items()}


def check_host(tensors: Mapping[str, torch.Tensor]) -> None:
    """Refuse, by its path, a leaf still on a device or of a dtype safetensors cannot store."""
    for name, t in tensors.items():
        if t.device.type != "cpu":
            raise RecordError(
                f"Record leaf {name!r} is on device {t.device}, not on the host; every leaf "
                "must be converted with .cpu() before writing (records hold host tensors only)."
            )
        if t.dtype not in DTYPES:
            raise RecordError(
                f"Record leaf {name!r} has dtype {t.dtype}, which safetensors cannot store; "
                f"convert it to one of {sorted(str(d) for d in DTYPES)}."
            )


class Layout:
    """Where each tensor of a record goes, and the header that says so."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> None:
        self.tensors = tensors
        self.meta = dict(meta)
        self.meta.pop(digest.LEGACY_KEY, None)  # a header read back from an older record
        self.order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
        self.entries: dict[str, Any] = {}
        offset = 0
        for name in self.order:
            t = tensors[name]
            size = t.numel() * t.element_size()
            self.entries[name] = {
                "dtype": DTYPES[t.dtype],
                "shape": list(t.shape),
                "data_offsets": [offset, offset + size],
            }
            offset += size
        self.data_bytes = offset
        self.sections = sorted({digest.section_of(n) for n in self.order})

    def header(self, sections: dict[str, str] | None) -> bytes:
        """``8-byte length + JSON header`` padded to 8 bytes; placeholder digests without
        ``sections``, which has the same length. The header digest is sealed in either way."""
        block = (
            digest.placeholder(self.sections, self.data_bytes)
            if sections is None
            else digest.block(sections, self.data_bytes)
        )
        # the integrity block first: its header digest at a fixed offset (digest.HEADER_SLOT)
        meta = {digest.KEY: block, **{k: v for k, v in self.meta.items() if k != digest.KEY}}
        # "format": "pt" beside it, as torch's safetensors files carry (transformers 4.x
        # refuses a file without it); after ``nitro``, so the header digest keeps its slot
        nitro = json.dumps(meta, separators=(",", ":"))
        header = {"__metadata__": {META_KEY: nitro, FORMAT_KEY: FORMAT_PT}}
        head = json.dumps({**header, **self.entries}, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)
        return digest.seal(struct.pack("<Q", len(head)) + head)

    def pieces(self) -> Iterator[tuple[str, memoryview]]:
        """``(section, bytes)`` of every tensor in file order, in pieces of at most 8 MiB."""
        for name in self.order:
            t = self.tensors[name].detach()
            if t.numel() == 0:
                continue
            data = _bytes_of(t)
            section = digest.section_of(name)
            for start in range(0, len(data), _CHUNK):
                yield section, data[start : start + _CHUNK]


def _bytes_of(t: torch.Tensor) -> memoryview:
    t = t.contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().data.cast("B")


def hash_sections(layout: Layout) -> dict[str, str]:
    """Every section's digest, hashing the host tensors (memory only, no I/O)."""
    sections = digest.Sections()
    for section, piece in layout.pieces():
        sections.update(section, piece)
    found = sections.hexdigests()
    return {name: found.get(name, digest.of_empty()) for name in layout.sections}


def writer(layout: Layout) -> Callable[[Any], Callable[[], str]]:
    """The ``write(file)`` a commit runs: stream the record, then put the final header in
    place; it returns a function giving the manifest's digest of the file."""

    def write(f: Any) -> Callable[[], str]:
        placeholder = layout.header(None)
        f.write(placeholder)
        for _, piece in layout.pieces():
            f.write(piece)
        f.flush()
        with ThreadPoolExecutor(max_workers=1) as pool:
            # the data goes to the disk while this thread hashes it from memory
            flushing = pool.submit(os.fdatasync, f.fileno())
            sections = hash_sections(layout)
            flushing.result()
        final = layout.header(sections)
        assert len(final) == len(placeholder), "the integrity block changed the header's size"
        os.pwrite(f.fileno(), final, 0)
        return lambda: digest.tree(final)

    return write
