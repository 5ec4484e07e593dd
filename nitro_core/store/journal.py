"""``manifest.journal``: the changes committed since ``manifest.json`` was last rewritten.

A checkpoint's manifest change (an entry added, evicted entries dropped, a point passed) is
one line appended under the manifest lock and fsynced, whatever the manifest's size; the
manifest is rewritten in full (compacted) only once the journal has grown to a fraction of
it, so the cost per checkpoint stays flat as a run grows. ``manifest.json`` names the last
change it includes (``journal``: its sequence number), and a reader applies only the lines
past it: the manifest is ``manifest.json`` and the journal's later lines, always read in
that pairing (:mod:`nitro_core.store.manifest`).

Grammar (one line each, ``\\n``-terminated; ``<check>`` is the xxh3-64 of the JSON text, 16
hex digits)::

    journal = header change*
    header  = <check> " " {"format": "nitro-manifest-journal/1", "after": N} "\\n"
    change  = <check> " " {"seq": N, "add": [entry...], "drop": [file...],
                           "points": [[run, point]...]} "\\n"

Changes are numbered ``after + 1, after + 2, ...``. A line is committed once its append is
fsynced; a last line that is incomplete or fails its check was never committed (the
writer died mid-append) and is ignored, and cut off by the next writer. A bad line before
the last is corruption.

Order of a compaction, so a SIGKILL anywhere leaves the changes readable exactly once:
``manifest.json`` is replaced (tmp, fsync, rename, directory fsync) naming the last change it
absorbed, then the journal is replaced by an empty one after that change. A reader reads
the journal first and ``manifest.json`` second: a compaction between the two reads only
makes ``manifest.json`` newer, and the lines it already holds are skipped by number.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from nitro_core.errors import CheckpointCorrupt
from nitro_core.store.recordio import commit
from nitro_core.store.safeio import fsync_dir, open_nofollow

NAME = "manifest.journal"
FORMAT = "nitro-manifest-journal/1"


@dataclass
class Journal:
    """A journal's committed lines, parsed: ``after`` and the changes past it, and the byte
    length of the committed part (``end``; a torn last line lies past it)."""

    after: int = 0
    changes: list[dict[str, Any]] = field(default_factory=list)
    end: int = 0

    @property
    def last(self) -> int:
        return self.changes[-1]["seq"] if self.changes else self.after


def line(obj: Any) -> bytes:
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    return xxhash.xxh3_64_hexdigest(text).encode() + b" " + text + b"\n"


def parse(data: bytes, path: Path, start: Journal | None = None, offset: int = 0) -> Journal:
    """The committed lines of ``data`` (the journal's bytes from ``offset``, continuing
    ``start``, whose lines end at ``offset``)."""
    journal = start if start is not None else Journal()
    at = 0
    while at < len(data):
        stop = data.find(b"\n", at)
        if stop < 0:
            break  # an incomplete last line: never committed
        text = data[at + 17 : stop]
        ok = data[at + 16 : at + 17] == b" " and data[at : at + 16] == (
            xxhash.xxh3_64_hexdigest(text).encode()
        )
        obj = _object(text) if ok else None
        if obj is None or not _fits(journal, obj, offset + at):
            if data.find(b"\n", stop + 1) < 0 and not data[stop + 1 :]:
                break  # the last line is torn: never committed
            raise CheckpointCorrupt(
                f"Manifest journal {str(path)!r} is corrupt at byte {offset + at}: a line that "
                "fails its check lies before the last one. Restore it from a backup, or remove "
                "it to fall back to manifest.json (the changes since its last rewrite are lost)."
            )
        if "format" in obj:
            journal.after = obj["after"]
        else:
            journal.changes.append(obj)
        at = stop + 1
        journal.end = offset + at
    return journal


def _object(text: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _fits(journal: Journal, obj: dict[str, Any], at: int) -> bool:
    """A header first, then changes numbered one after another."""
    if at == 0:
        return obj.get("format") == FORMAT and type(obj.get("after")) is int
    return "format" not in obj and obj.get("seq") == journal.last + 1


def read(directory: Path) -> tuple[bytes, os.stat_result] | None:
    """The journal's bytes and its stat, or None when there is none."""
    try:
        fd = open_nofollow(Path(directory) / NAME, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        return f.read(), st


def append(directory: Path, journal: Journal, change: dict[str, Any]) -> bytes:
    """Append ``change`` (numbered ``journal.last + 1``) and fsync; the caller holds the
    manifest lock and read ``journal`` under it. A torn last line is cut off first.
    Returns the bytes appended."""
    path = Path(directory) / NAME
    seq = journal.last + 1
    fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT)
    try:
        created = journal.end == 0
        data = line({"format": FORMAT, "after": journal.after}) if created else b""
        if os.fstat(fd).st_size != journal.end:
            os.ftruncate(fd, journal.end)
        data += line({"seq": seq, **change})
        os.pwrite(fd, data, journal.end)
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(Path(directory))
    journal.end += len(data)
    journal.changes.append({"seq": seq, **change})
    return data


def reset(directory: Path, after: int) -> bytes:
    """Replace the journal by an empty one after change ``after`` (a compaction's last
    step, once ``manifest.json`` holds every change up to it); returns its bytes."""
    first = line({"format": FORMAT, "after": after})
    commit(lambda f: f.write(first), Path(directory) / NAME)
    return first
