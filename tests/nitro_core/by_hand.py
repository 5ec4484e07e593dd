"""Record digests computed as their definition reads (nitro_core.store.digest), from the
bytes on disk alone, so tests check the writer and readers against an independent reading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import xxhash


def header_and_data(path: Path) -> tuple[bytes, dict[str, Any], bytes]:
    """(the first 8 + N bytes, the JSON header, the data section)."""
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return raw[: 8 + n], json.loads(raw[8 : 8 + n]), raw[8 + n :]


def tree(path: Path) -> str:
    """The manifest's digest: xxh3-128 of the header bytes."""
    head, _, _ = header_and_data(path)
    return "xxh3-128-tree:" + xxhash.xxh3_128(head).hexdigest()


def sections(path: Path) -> dict[str, str]:
    """Section -> xxh3-128 of its tensors' bytes concatenated in file order."""
    _, header, data = header_and_data(path)
    tensors = sorted(
        ((k, v) for k, v in header.items() if k != "__metadata__"),
        key=lambda kv: kv[1]["data_offsets"][0],
    )
    joined: dict[str, bytes] = {}
    for name, info in tensors:
        section = name.split("/", 1)[0] if "/" in name else "tensors"
        begin, end = info["data_offsets"]
        joined[section] = joined.get(section, b"") + data[begin:end]
    return {s: xxhash.xxh3_128(b).hexdigest() for s, b in sorted(joined.items())}


def header_digest(path: Path) -> str:
    """xxh3-128 of the header bytes with the 32 hex digits of ``integrity.header`` (the
    first value of the ``nitro`` metadata) zeroed."""
    head, _, _ = header_and_data(path)
    slot = b'{"__metadata__":{"nitro":"{\\"integrity\\":{\\"header\\":\\"'
    assert head[8 : 8 + len(slot)] == slot, "the header digest is not where it belongs"
    at = 8 + len(slot)
    return xxhash.xxh3_128(head[:at] + b"0" * 32 + head[at + 32 :]).hexdigest()


def integrity(path: Path) -> dict[str, Any]:
    """The integrity block the header must carry."""
    _, _, data = header_and_data(path)
    return {
        "header": header_digest(path),
        "algorithm": "xxh3-128",
        "data_bytes": len(data),
        "sections": sections(path),
    }


def section_range(path: Path, section: str) -> tuple[int, int]:
    """File offsets (begin, end) of the first tensor of ``section`` with bytes."""
    head, header, _ = header_and_data(path)
    for name, info in sorted(
        ((k, v) for k, v in header.items() if k != "__metadata__"),
        key=lambda kv: kv[1]["data_offsets"][0],
    ):
        begin, end = info["data_offsets"]
        if (name.split("/", 1)[0] if "/" in name else "tensors") == section and end > begin:
            return len(head) + begin, len(head) + end
    raise LookupError(f"{path} has no bytes in section {section!r}")
