"""The manifest file's bytes: its name, reading it without following a link, committing a
new one (through :class:`~nitro_core.store.atomic.Replace`, under the caller's
:func:`~nitro_core.store.claims.manifest_lock`), the room a rewrite needs, and parsing a large
JSON document without the cyclic collector. Torch-free, so listing and reading a manifest
(``nitro runs``, a server's tool listing) never loads torch; :mod:`~nitro_core.store.recordio`
re-exports every name."""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nitro_core.errors import DiskFull
from nitro_core.store.atomic import Replace
from nitro_core.store.safeio import open_nofollow, read_capped

MANIFEST_NAME = "manifest.json"
MANIFEST_ROOM = 64 * 1024  # free bytes kept beyond the manifest's size before a record commits


@contextmanager
def paused_gc() -> Iterator[None]:
    """Parse a large JSON document without the cyclic collector scanning every new object
    (with torch imported a full collection takes ~100 ms); it is acyclic, so nothing leaks."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load_manifest_bytes(directory: Path) -> bytes | None:
    """The manifest's bytes, or None when the directory has none. A ``manifest.json`` that is
    a link is refused unread (:class:`UnsafePath`)."""
    try:
        fd = open_nofollow(Path(directory) / MANIFEST_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return read_capped(f, "manifest", str(Path(directory) / MANIFEST_NAME))


def save_manifest_json(directory: Path, data: Mapping[str, Any]) -> None:
    """Commit the manifest document ``data``; the caller holds :func:`manifest_lock`."""
    save_manifest_bytes(directory, json.dumps(data, indent=1, allow_nan=False).encode())


def save_manifest_bytes(directory: Path, body: bytes) -> None:
    """Commit ``body`` as ``manifest.json``; the caller holds :func:`manifest_lock`."""
    directory = Path(directory)

    def disk_full(free: int) -> DiskFull:
        return DiskFull(
            f"No room left in {str(directory)!r} to rewrite manifest.json: it needs {len(body)} "
            f"bytes, {free} are free. Kept: manifest.json as it was before this update, with "
            "every record it lists (the temporary file was removed); a record written for this "
            "update is not listed and counts for nothing. Free space on that disk and resume "
            "with resume='auto'."
        )

    Replace(directory / MANIFEST_NAME, disk_full).commit(lambda f: f.write(body))


def manifest_room(directory: Path) -> int:
    """Free bytes a rewrite of ``directory``'s manifest needs: its size and a margin (the
    new one is written beside the old before the rename frees it)."""
    try:
        size = os.lstat(Path(directory) / MANIFEST_NAME).st_size
    except FileNotFoundError:
        size = 0
    return size + MANIFEST_ROOM


__all__ = [
    "MANIFEST_NAME",
    "MANIFEST_ROOM",
    "load_manifest_bytes",
    "manifest_room",
    "paused_gc",
    "save_manifest_bytes",
    "save_manifest_json",
]
