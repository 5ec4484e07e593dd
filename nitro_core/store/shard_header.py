"""A record directory's ``header.json`` (a record several processes wrote:
:mod:`~nitro_core.store.shards`): its name and its shards' names, reading it (never through a
link, never a FIFO) and checking it against the manifest's digest or its own. Torch-free, so
``nitro info`` and listings read a sharded record's header without torch."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from nitro_core.errors import CheckpointCorrupt, CheckpointMissing
from nitro_core.store import digest
from nitro_core.store.safeio import open_nofollow, read_capped

HEADER_NAME = "header.json"
SHARD_NAME = re.compile(r"^shard-\d+-model-\d+-of-\d+\.safetensors$")  # DCP's names


def missing_header(path: Path) -> CheckpointMissing:
    return CheckpointMissing(
        f"Checkpoint {str(path)!r} is a directory without {HEADER_NAME}, so not a "
        "committed sharded record (a write interrupted before its commit leaves "
        "'<name>.tmp'). Load another checkpoint."
    )


def refuse_odd_header(path: Path) -> None:
    """Refuse a ``header.json`` that is neither a regular file nor a link (a link is refused
    by the open that follows, a missing one is :func:`missing_header`): a directory or a FIFO
    (whose open would block), never opened."""
    try:
        mode = os.lstat(path / HEADER_NAME).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file (a FIFO or a device)"
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r}: its {HEADER_NAME} is {kind}, not the file rank 0 "
            "wrote, so its shards cannot be checked. Load another checkpoint."
        )


def header_bytes(path: Path) -> bytes:
    """The bytes of the record directory's ``header.json`` (refused when odd or missing)."""
    refuse_odd_header(path)
    try:
        fd = open_nofollow(path / HEADER_NAME, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        raise missing_header(path) from None
    with os.fdopen(fd, "rb") as f:
        return read_capped(f, "record header", str(path / HEADER_NAME))


def checked_header(path: Path, expected: str | None) -> dict[str, Any]:
    """``header.json`` parsed and checked: against ``expected`` (the manifest's digest) when
    the record is listed, else against the digest it carries (which a header that says it was
    written with one must carry)."""
    raw = header_bytes(path)
    if expected is not None and digest.tree(raw) != expected:
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r}: its {HEADER_NAME} does not match the manifest's digest "
            f"({digest.short(expected)}); the record changed since it was written. Load "
            "another checkpoint."
        )
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except ValueError as exc:
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r}: its {HEADER_NAME} is not readable ({exc}). Load "
            "another checkpoint."
        ) from None
    found = digest.json_header_check(header) if expected is None else None
    if found is not None and found[0] != found[1]:
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r}: its {HEADER_NAME} digests to "
            f"{digest.ALGORITHM}:{found[1][:16]}..., its integrity block recorded "
            f"{digest.ALGORITHM}:{str(found[0])[:16]}... when it was written (the header was "
            "edited since). Load another checkpoint."
        )
    if expected is None and found is None and digest.requires_header_digest(header):
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r}: its {HEADER_NAME} carries no digest of its own "
            f"(integrity.header), yet it says format_version {header.get('format_version')!r}, "
            f"written with one (a record written before header digests says "
            f"{digest.HEADER_DIGEST_SINCE - 1}); it was edited since. Load another checkpoint."
        )
    return header


def read_header(path: Path, expected: str | None = None) -> dict[str, Any]:
    """The JSON header of a record directory (checked as :func:`verify` checks it, without
    its shards): its metadata, without the shard list."""
    meta = checked_header(Path(path), expected)
    meta.pop("shards", None)
    return meta


__all__ = [
    "HEADER_NAME",
    "SHARD_NAME",
    "checked_header",
    "header_bytes",
    "missing_header",
    "read_header",
    "refuse_odd_header",
]
