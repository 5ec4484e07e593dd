"""``manifest.journal``: the changes committed since ``manifest.json`` was last rewritten.

A checkpoint's manifest change (an entry added, evicted entries dropped, a point passed) is
one line appended under the manifest lock and fsynced, whatever the manifest's size; the
manifest is rewritten in full (compacted) only once the journal has grown to a fraction of
it, so the cost per checkpoint stays flat as a run grows. ``manifest.json`` names the last
change it includes (``journal``: its sequence number) and, while a journal continues it, that
journal's identity (``journal_id``); a reader applies only the lines past the number: the
manifest is ``manifest.json`` and the journal's later lines, always read in that pairing
(:mod:`nitro_core.store.manifest`, which also refuses a pairing that does not match).

Grammar (one line each, ``\\n``-terminated; ``<check>`` is the xxh3-64 of the JSON text, 16
hex digits)::

    journal = header change*
    header  = <check> " " {"format": "nitro-manifest-journal/1", "after": N, "id": ID} "\\n"
    change  = <check> " " {"seq": N, "add": [entry...], "drop": [file...],
                           "points": [[run, point]...]} "\\n"

``ID`` is the ``journal_id`` of the ``manifest.json`` the journal continues (16 hex digits;
a header written before identities has none). Changes are numbered ``after + 1, after + 2,
...``. A line is committed once its append is fsynced. Only a last line without its final
newline is torn (the writer died mid-append: one ``pwrite`` puts the newline last): it was
never committed, is ignored, and is cut off by the next writer. A complete line whose check
verifies is committed whatever byte follows it (its newline changed to another byte loses
no change: the line is read up to the end of its verified JSON). Any line that ends in its
newline and fails its check (the checksum, the numbering, the header) was committed and then
changed: that is corruption, refused with the line's byte offset, and nothing is written.

Order of each step, so a SIGKILL anywhere leaves the manifest as it was before or after:

- a compaction replaces ``manifest.json`` (tmp, fsync, rename, directory fsync) naming the
  last change it absorbed, then replaces the journal by an empty one after that change. A
  reader reads the journal first and ``manifest.json`` second: a compaction between the two
  reads only makes ``manifest.json`` newer, and the lines it already holds are skipped.
- a journal is started (a new identity) before ``manifest.json`` names it: until then the
  manifest is complete on its own and the new journal holds no change.
- a journal is removed after ``manifest.json`` stops naming it (``journal_id`` null).
"""

from __future__ import annotations

import json
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from nitro_core.errors import CheckpointCorrupt
from nitro_core.store.atomic import Replace
from nitro_core.store.manifest_file import MANIFEST_NAME
from nitro_core.store.safeio import open_nofollow

NAME = "manifest.journal"
FORMAT = "nitro-manifest-journal/1"
ID_PATTERN = r"^[0-9a-f]{16}$"
_ID = re.compile(ID_PATTERN)


@dataclass
class Journal:
    """A journal's committed lines, parsed: its header (``after``, ``id``), the changes past
    it, and the byte length of the committed part (``end``: 0 when there is no complete
    header; a torn last line lies past it)."""

    after: int = 0
    id: str | None = None
    changes: list[dict[str, Any]] = field(default_factory=list)
    end: int = 0

    @property
    def last(self) -> int:
        return self.changes[-1]["seq"] if self.changes else self.after

    def past(self, seq: int) -> list[dict[str, Any]]:
        """The changes numbered after ``seq``."""
        return [c for c in self.changes if c["seq"] > seq]


def new_id() -> str:
    """A fresh journal identity."""
    return secrets.token_hex(8)


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
        obj = _checked(data[at:stop]) if stop >= 0 else None
        if obj is None:  # a complete line whose newline byte was changed is still committed
            found = _line_before_other_byte(data, at, stop if stop >= 0 else len(data))
            if found is not None:
                obj, stop = found
            elif stop < 0:
                break  # no final newline: a torn append, never committed
        if obj is None or not _fits(journal, obj, offset + at):
            raise CheckpointCorrupt(_corrupt(path, offset + at))
        if offset + at == 0:
            journal.after, journal.id = obj["after"], obj.get("id")
        else:
            journal.changes.append(obj)
        at = stop + 1
        journal.end = offset + at
    return journal


def _line_before_other_byte(data: bytes, at: int, end: int) -> tuple[dict[str, Any], int] | None:
    """A line from ``at`` whose check verifies and that another byte than its newline
    follows (a flipped newline: the line was written whole, so it was committed), as (its
    object, the position of that byte); None when no prefix up to ``end`` verifies. A torn
    append is a prefix of its line, so nothing follows the line's own bytes: a complete line
    at the very end of the data without its newline stays torn."""
    close = data.find(b"}", at + 17, end)
    while close >= 0:
        if close + 1 < len(data) and (obj := _checked(data[at : close + 1])) is not None:
            return obj, close + 1
        close = data.find(b"}", close + 1, end)
    return None


def _corrupt(path: Path, at: int) -> str:
    where = "its header" if at == 0 else "the line there"
    fix = (
        f"Restore {NAME} from a backup."
        if at == 0
        else f"Restore {NAME} from a backup, or keep the changes before that line with "
        f"`truncate -s {at} {str(path)!r}` (the changes from it on are lost)."
    )
    return (
        f"Manifest journal {str(path)!r} is corrupt at byte {at}: {where} ends in a newline, so "
        "it was committed, but it fails its check (a write cut short never ends in one). "
        f"Nothing was deleted, and nothing is written to this directory while it is corrupt. {fix}"
    )


def _checked(raw: bytes) -> dict[str, Any] | None:
    """The line's JSON object when its check matches, else None."""
    text = raw[17:]
    if raw[16:17] != b" " or raw[:16] != xxhash.xxh3_64_hexdigest(text).encode():
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _fits(journal: Journal, obj: dict[str, Any], at: int) -> bool:
    """A header first, then changes numbered one after another."""
    if at == 0:
        after, ident = obj.get("after"), obj.get("id")
        return (
            obj.get("format") == FORMAT
            and set(obj) <= {"format", "after", "id"}
            and type(after) is int
            and after >= 0
            and (ident is None or (isinstance(ident, str) and _ID.fullmatch(ident) is not None))
        )
    return "format" not in obj and type(obj.get("seq")) is int and obj["seq"] == journal.last + 1


def append(directory: Path, journal: Journal, change: dict[str, Any]) -> bytes:
    """Append ``change`` (numbered ``journal.last + 1``) and fsync; the caller holds the
    manifest lock and read ``journal`` (its header included) under it. A torn last line is
    cut off first. Returns the bytes appended."""
    assert journal.end > 0, "a journal is started (with its header) before a change is appended"
    seq = journal.last + 1
    data = line({"seq": seq, **change})
    fd = open_nofollow(Path(directory) / NAME, os.O_WRONLY)  # never created here
    try:
        if os.fstat(fd).st_size != journal.end:
            os.ftruncate(fd, journal.end)
        os.pwrite(fd, data, journal.end)
        os.fsync(fd)
    finally:
        os.close(fd)
    journal.end += len(data)
    journal.changes.append({"seq": seq, **change})
    return data


def reset(directory: Path, after: int, ident: str) -> bytes:
    """Replace the journal by an empty one after change ``after`` continuing the
    ``manifest.json`` whose ``journal_id`` is ``ident`` (tmp, fsync, rename, directory
    fsync); returns its bytes."""
    first = line({"format": FORMAT, "after": after, "id": ident})
    Replace(Path(directory) / NAME).commit(lambda f: f.write(first))
    return first


def remove(directory: Path) -> None:
    """Remove the journal (``manifest.json`` names none any more). No directory fsync: a
    journal that comes back after a power loss holds only changes ``manifest.json`` holds."""
    try:
        os.unlink(Path(directory) / NAME)
    except FileNotFoundError:
        pass


def mismatch(
    directory: Path, journal: Journal, exists: bool, manifest_last: int, manifest_id: str | None
) -> str | None:
    """Why ``journal`` (``exists``: whether the file is there) does not continue the
    ``manifest.json`` that holds the changes up to ``manifest_last`` and names the journal
    ``manifest_id`` (None: it is complete on its own); None when it does."""
    jp, mp = str(Path(directory) / NAME), str(Path(directory) / MANIFEST_NAME)
    if manifest_id is not None:
        what = _not_continuing(journal, exists, manifest_id)
        if what is not None:
            undo = f'remove its "journal_id" key{f" and remove {NAME}" if exists else ""}'
            return (
                f"Manifest {mp!r} says that the changes committed after its change "
                f"{manifest_last} are in {jp!r} (journal {manifest_id}), but {what}. It is "
                "refused rather than read as manifest.json alone, which would silently drop "
                "those changes (a resume would go back, and retention would act on an old "
                f"list). Nothing was deleted. Restore {NAME} from a backup of this directory; "
                f"to accept losing the changes since manifest.json was last rewritten, {undo}."
            )
    elif journal.id is not None:  # it continues no manifest.json here: it must hold nothing new
        if later := journal.past(manifest_last):
            return (
                f"Manifest journal {jp!r} holds changes {later[0]['seq']} to {later[-1]['seq']}, "
                f"past the last change of {mp!r} ({manifest_last}), but manifest.json names no "
                f"journal: this one (journal {journal.id}) continues another copy of it (an "
                "older manifest.json restored, or a journal copied in from another directory). "
                "Nothing was deleted. Restore both files from the same backup, or remove "
                f"{NAME} to keep manifest.json as it is (those changes are lost)."
            )
        return None
    if journal.end > 0 and journal.after > manifest_last:
        return (
            f"Manifest {mp!r} holds the changes up to {manifest_last}, but its journal {jp!r} "
            f"starts after change {journal.after}: changes {manifest_last + 1} to "
            f"{journal.after} are in neither file (manifest.json is older than its journal: "
            "restored from an older copy?). Nothing was deleted. Restore both files from the "
            "same backup."
        )
    return None


def _not_continuing(journal: Journal, exists: bool, manifest_id: str) -> str | None:
    if not exists:
        return "that file is missing"
    if journal.end == 0:
        return "that file is empty (it holds no complete line)"
    if journal.id is None:
        return (
            "that file is another manifest's journal (its header names no journal: it was "
            "written before journals had one)"
        )
    if journal.id != manifest_id:
        return f"that file is another manifest's journal (its header names journal {journal.id})"
    return None
