"""The manifest: which records a directory holds, and the lookups that read it alone.

``manifest.json`` lists one :class:`ManifestEntry` per kept record, in commit order; the
changes committed since it was last rewritten sit in ``manifest.journal`` beside it
(:mod:`nitro_core.store.journal`), and :func:`load` applies them, so a checkpoint's manifest
change costs one appended line, not a rewrite of every entry. While a journal continues it,
``manifest.json`` names it (``journal_id``, also in the journal's header): a journal that is
missing, empty, another's or corrupt is refused (:class:`CheckpointCorrupt`), never read
around, and nothing is written beside it. A record counts only once the manifest lists it;
lookups, selection, resume and retention read these entries and never open a record.

A process keeps the last manifest it read or wrote per directory, checked against both
files' identity (device, inode, size, modification time) before each use: a checkpoint
reads the manifest once, not once per step of its commit. A ``manifest.json`` modified
within the file system's timestamp granularity of being read is checked by content instead
(git's "racy" index rule); the journal, only ever appended to or replaced, is read on from
where it ended once its last bytes are still there, and in full otherwise.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import xxhash
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    field_validator,
    model_validator,
)

from nitro_core.errors import CheckpointCorrupt
from nitro_core.store import digest, journal
from nitro_core.store.claims import manifest_lock
from nitro_core.store.manifest_file import MANIFEST_NAME, paused_gc, save_manifest_bytes
from nitro_core.store.safeio import open_nofollow, read_capped

FORMAT: Final = "nitro-manifest/1"

Mode = Literal["min", "max"]
StopReason = Literal["completed", "early_stop", "requested", "budget"]


def _finite(v: float | None) -> float | None:
    if v is not None and not math.isfinite(v):
        raise ValueError(f"score {v!r} is not finite; a NaN or infinite score cannot be ranked")
    return v


Score = Annotated[float | None, AfterValidator(_finite)]  # refused when read, as the spec says


_JOURNAL_ID = journal.ID_PATTERN  # (a field of Manifest is named journal)
_NOT_RECORDS = (".tmp", ".stale", ".json", ".lock", ".jsonl", ".pt", ".bin")


class ManifestEntry(BaseModel):
    """One kept record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str = Field(description="Record file name, relative to the run directory.")
    epoch: int = Field(ge=0, description="The epoch the record ends, or is in (mid-epoch).")
    batch: int | None = Field(
        default=None,
        ge=1,
        description="Batches of the epoch consumed at a mid-epoch record "
        "(Checkpointer(every_steps=N)); null at an epoch end.",
    )
    step: int = Field(ge=0)
    score: Score = Field(description="The monitored metric at this epoch, if validated.")
    metric: str | None = Field(description="Name of the ranked metric, e.g. 'loss' or 'acc'.")
    mode: Mode | None
    stop_reason: StopReason | None = Field(description="Set on the record a run ended with.")
    run: str = Field(description="Id of the run that wrote the record.")
    parent: str | None = Field(
        default=None, description="'<run>/<file>' of the record this run branched from."
    )
    written: str = Field(description="UTC time the record was committed (ISO 8601).")
    keep: str | None = Field(
        default=None,
        description="The keep selectors of the run that wrote it, e.g. '(Best(3), Last(1))'.",
    )
    bytes: int = Field(ge=0)
    digest: str | None = Field(
        default=None,
        pattern=r"^xxh3-128-tree:[0-9a-f]{32}$",
        description="The file's digest: xxh3-128 of its header bytes, whose integrity block "
        "names the xxh3-128 of every section, so it covers every byte.",
    )
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="The whole file's sha256, in entries written before 'digest'.",
    )

    @model_validator(mode="after")
    def _has_a_digest(self) -> ManifestEntry:
        if self.digest is None and self.sha256 is None:
            raise ValueError(f"entry {self.file!r} has neither digest nor sha256")
        return self

    @property
    def expected(self) -> str:
        """What a reader checks the file against: ``xxh3-128-tree:<hex>``, or
        ``sha256:<hex>`` for an entry written before."""
        return self.digest if self.digest is not None else f"{digest.LEGACY_FILE}:{self.sha256}"

    @field_validator("file")
    @classmethod
    def _bare_name(cls, v: str) -> str:
        # a record file, or a record directory (several processes wrote it: no suffix)
        directory = not v.endswith(".safetensors") and not v.endswith(_NOT_RECORDS)
        if (
            "/" in v
            or "\\" in v
            or v.startswith(".")
            or not (v.endswith(".safetensors") or directory)
        ):
            raise ValueError(f"file {v!r} is not a bare record name in the run directory")
        return v

    @property
    def pair(self) -> tuple[str | None, Mode | None]:
        return (self.metric, self.mode)

    @property
    def is_directory(self) -> bool:
        """Whether the record is a record directory (several processes wrote it: a
        ``header.json`` and one shard per rank) rather than a record file."""
        return not self.file.endswith(".safetensors")


class Point(BaseModel):
    """One checkpoint point a run passed (an epoch end, or with ``every_steps`` a step inside
    an epoch: ``batch`` set), written or not: what ``Last(k)`` and ``Best(k)`` mean when a run
    is averaged ("the last k points", "the best k ever scored")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epoch: int = Field(ge=0)
    batch: int | None = Field(default=None, ge=1)
    step: int = Field(ge=0)
    score: Score = None
    metric: str | None = None
    mode: Mode | None = None

    @property
    def pair(self) -> tuple[str | None, Mode | None]:
        return (self.metric, self.mode)


class Manifest(BaseModel):
    """The whole manifest file: the kept entries, and every run's points."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["nitro-manifest/1"] = FORMAT
    journal: int = Field(
        default=0, ge=0, description="The last manifest.journal change this document holds."
    )
    journal_id: str | None = Field(
        default=None,
        pattern=_JOURNAL_ID,
        description="The identity of the manifest.journal that continues this document (its "
        "header names it too); absent when the document is complete on its own.",
    )
    entries: list[ManifestEntry] = Field(default_factory=list)
    points: dict[str, list[Point]] = Field(
        default_factory=dict,
        description="Run id -> every point the run passed, oldest first (written or not).",
    )

    def add_point(self, run: str, point: Point) -> None:
        """Record ``point``; points of ``run`` at or past its step belong to a timeline a
        resume replaced, and are dropped."""
        mine = self.points.setdefault(run, [])
        if mine and mine[-1].step >= point.step:
            mine[:] = [p for p in mine if p.step < point.step]
        mine.append(point)

    def apply(self, change: dict[str, Any]) -> None:
        """Apply one journal change (entries added, files dropped, points passed)."""
        self.entries.extend(ManifestEntry.model_validate(e) for e in change.get("add", ()))
        if drop := set(change.get("drop", ())):
            self.entries = [e for e in self.entries if e.file not in drop]
        for run, point in change.get("points", ()):
            self.add_point(run, Point.model_validate(point))
        self.journal = change["seq"]

    def copy_out(self) -> Manifest:
        """A copy whose lists a caller may change."""
        return Manifest.model_construct(
            format=self.format,
            journal=self.journal,
            journal_id=self.journal_id,
            entries=list(self.entries),
            points={run: list(points) for run, points in self.points.items()},
        )

    def to_json(self) -> bytes:
        """The document ``manifest.json`` holds (an entry's absent digest is left out)."""
        data = self.model_dump(mode="json")
        if data["journal_id"] is None:
            del data["journal_id"]
        for entry in data["entries"]:
            for key in ("digest", "sha256"):
                if entry[key] is None:
                    del entry[key]
        return json.dumps(data, indent=1, allow_nan=False).encode()


_MANIFEST = TypeAdapter(Manifest)


def point_of(entry: ManifestEntry) -> Point:
    """The point a record was written at, as a run's history keeps it."""
    return Point(
        epoch=entry.epoch, batch=entry.batch, step=entry.step, score=entry.score,
        metric=entry.metric, mode=entry.mode,
    )  # fmt: skip


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def read_manifest(run_dir: str | Path) -> list[ManifestEntry]:
    """The entries of ``run_dir``'s manifest in commit order (empty when there is none)."""
    return list(_current(Path(run_dir)).state.entries)


SMALL = 256 * 1024  # bytes: below this a change rewrites manifest.json (as cheap as a line)
_RACY_NS = 50_000_000  # a file modified this close to being read is checked by content
_KEEP = 16  # directories whose manifest a process keeps


@dataclass
class _Seen:
    """What this process last read or wrote of one directory's manifest."""

    base_key: tuple[int, ...] | None = None  # manifest.json's (dev, ino, size, mtime_ns)
    base_hash: str = ""  # xxh3-128 of its bytes, for a racy check
    base: Manifest = field(default_factory=Manifest)  # manifest.json alone
    base_size: int = 0
    journal_key: tuple[int, ...] | None = None  # the journal's (dev, ino, size, mtime_ns)
    journal: journal.Journal = field(default_factory=journal.Journal)
    journal_tail: bytes = b""  # the last bytes of its committed part: still there once grown
    state: Manifest = field(default_factory=Manifest)  # base + the journal's later changes
    checked_ns: int = 0


# One entry per directory: the parsed manifest, reused while the files are unchanged.
# Process-wide by nature (it saves re-parsing what this process already holds), bounded.
_SEEN: dict[str, _Seen] = {}


def load(run_dir: Path) -> Manifest:
    """The manifest of ``run_dir`` (``manifest.json`` and its journal's later changes), as a
    copy the caller may change."""
    return _current(Path(run_dir)).state.copy_out()


def _current(run_dir: Path) -> _Seen:
    """This process's view of ``run_dir``'s manifest, brought up to date: the journal read
    first, ``manifest.json`` second (see :mod:`~nitro_core.store.journal`), the pair checked.
    Anything raised drops the cached view, so the next call reads both files again."""
    key = str(run_dir)
    seen = _SEEN.pop(key, None) or _Seen()
    now = time.time_ns()
    changed = _refresh_journal(run_dir, seen)
    changed = _refresh_base(run_dir, seen) or changed
    changed = _paired(run_dir, seen) or changed
    if changed:
        state = seen.base.copy_out()
        continues = seen.journal.id is None or seen.journal.id == seen.base.journal_id
        for change in seen.journal.changes if continues else ():
            if change["seq"] > state.journal:
                try:
                    state.apply(change)
                except ValueError as exc:
                    raise CheckpointCorrupt(
                        f"Manifest journal {str(run_dir / journal.NAME)!r} holds an invalid "
                        f"change {change.get('seq')}: {exc}. Restore it from a backup."
                    ) from None
        seen.state = state
    seen.checked_ns = now
    _SEEN[key] = seen  # most recent last
    while len(_SEEN) > _KEEP:
        del _SEEN[next(iter(_SEEN))]
    return seen


_ROUNDS = 1000  # re-reads of a pair that a writer keeps changing, before it is refused


def _paired(run_dir: Path, seen: _Seen) -> bool:
    """Check that the journal read continues the ``manifest.json`` read; returns whether a
    re-read changed either. A pair that does not match is read again while a writer is seen
    moving between the two reads (every state a writer leaves matches: journal.py), and
    refused once a re-read finds both files as they were."""
    changed = False
    for _ in range(_ROUNDS):
        problem = journal.mismatch(
            run_dir, seen.journal, seen.journal_key is not None, seen.base.journal,
            seen.base.journal_id,
        )  # fmt: skip
        if problem is None:
            return changed
        moved = _refresh_journal(run_dir, seen)
        if not (_refresh_base(run_dir, seen) or moved):
            break
        changed = True
    assert problem is not None  # the rounds ended on a mismatch
    raise CheckpointCorrupt(problem)


def _racy(st: os.stat_result, seen: _Seen) -> bool:
    return st.st_mtime_ns + _RACY_NS >= seen.checked_ns


def _refresh_base(run_dir: Path, seen: _Seen) -> bool:
    """Re-read ``manifest.json`` when it changed; returns whether it did."""
    path = run_dir / MANIFEST_NAME
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        changed = seen.base_key is not None
        seen.base_key, seen.base, seen.base_size = None, Manifest(), 0
        return changed
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        key = _key(st)
        if key == seen.base_key and not _racy(st, seen):
            return False
        data = read_capped(f, "manifest", str(path))
    content = xxhash.xxh3_128_hexdigest(data)
    if key == seen.base_key and content == seen.base_hash:
        return False
    seen.base = _parse(path, data)
    seen.base_key, seen.base_hash, seen.base_size = key, content, len(data)
    return True


def _refresh_journal(run_dir: Path, seen: _Seen) -> bool:
    """Read the journal's new lines (all of it when it was replaced or changed in place);
    returns whether what it holds changed."""
    path = run_dir / journal.NAME
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        changed = seen.journal_key is not None
        seen.journal_key, seen.journal, seen.journal_tail = None, journal.Journal(), b""
        return changed
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        key = _key(st)
        if key == seen.journal_key:  # (no racy rule: only a hand edit rewrites it in place)
            return False
        old, tail = seen.journal, seen.journal_tail
        # lines are only ever appended to a journal; a hand edit shows in the last one
        grown = seen.journal_key is not None and seen.journal_key[:2] == key[:2]
        grown = grown and st.st_size > old.end and old.end > 0
        if grown and tail:
            grown = os.pread(f.fileno(), len(tail), old.end - len(tail)) == tail
        if grown:
            data = os.pread(f.fileno(), st.st_size - old.end, old.end)
            parsed = journal.parse(data, path, _copied(old), old.end)
        else:
            parsed = journal.parse(read_capped(f, "journal", str(path)), path)
        seen.journal_tail = os.pread(
            f.fileno(), min(64, parsed.end), parsed.end - min(64, parsed.end)
        )
    seen.journal_key, seen.journal = key, parsed
    return (parsed.after, parsed.id, parsed.end, parsed.changes) != (
        old.after, old.id, old.end, old.changes,
    )  # fmt: skip


def _key(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _copied(j: journal.Journal) -> journal.Journal:
    return journal.Journal(after=j.after, id=j.id, changes=list(j.changes), end=j.end)


def parse_manifest(path: Path, data: bytes) -> Manifest:
    """The manifest document ``data`` (read from ``path``), validated."""
    return _parse(path, data)


def _parse(path: Path, data: bytes) -> Manifest:
    try:
        with paused_gc():
            return _MANIFEST.validate_json(data)
    except ValueError as exc:
        raise CheckpointCorrupt(
            f"Manifest {str(path)!r} is not valid: {exc}. "
            "Restore it from a backup; the records beside it are intact."
        ) from None


@contextmanager
def _writing(run_dir: Path) -> Iterator[_Seen]:
    """This process's view of ``run_dir``, for a write that updates it as it goes; a write
    that fails drops the view (the files are read again next time)."""
    seen = _current(run_dir)
    try:
        yield seen
    except BaseException:
        _SEEN.pop(str(run_dir), None)
        raise


def save(run_dir: Path, manifest: Manifest, journal_id: str | None = None) -> None:
    """Rewrite ``manifest.json`` with ``manifest`` (a compaction); the caller holds
    ``manifest_lock(run_dir)`` and loaded ``manifest`` under it. With ``journal_id``
    the journal of that identity continues it, emptied (started first when new); without,
    ``manifest.json`` is complete on its own and the journal is removed after it."""
    run_dir = Path(run_dir)
    with _writing(run_dir) as seen:
        # the new document holds every change so far, so none is applied twice
        state = manifest.copy_out()
        state.journal = max(manifest.journal, seen.journal.last, seen.base.journal)
        state.journal_id = journal_id
        if journal_id is None:  # complete: the journal is removed once manifest.json holds it
            _write_base(run_dir, seen, state)
            if seen.journal_key is not None:
                journal.remove(run_dir)
                seen.journal_key, seen.journal, seen.journal_tail = None, journal.Journal(), b""
        elif journal_id != seen.base.journal_id:  # a new journal first: empty until named
            if seen.journal.id is None and seen.journal.past(seen.base.journal):
                save(run_dir, state)  # a journal written before identities: folded in first
            _started(run_dir, seen, journal.reset(run_dir, state.journal, journal_id), state)
            _write_base(run_dir, seen, state)
        else:  # a compaction: manifest.json first, then the journal emptied after it
            _write_base(run_dir, seen, state)
            _started(run_dir, seen, journal.reset(run_dir, state.journal, journal_id), state)


def _write_base(run_dir: Path, seen: _Seen, state: Manifest) -> None:
    body = state.to_json()
    save_manifest_bytes(run_dir, body)
    st = os.stat(run_dir / MANIFEST_NAME, follow_symlinks=False)
    seen.base_key = _key(st)
    seen.base_hash, seen.base_size = xxhash.xxh3_128_hexdigest(body), len(body)
    seen.base, seen.state = state, state.copy_out()


def _started(run_dir: Path, seen: _Seen, first: bytes, state: Manifest) -> None:
    """Hold the journal just replaced by its header ``first`` (after ``state.journal``)."""
    st = os.stat(run_dir / journal.NAME, follow_symlinks=False)
    seen.journal_key = _key(st)
    seen.journal = journal.Journal(after=state.journal, id=state.journal_id, end=len(first))
    seen.journal_tail = first[-64:]


def commit(
    run_dir: Path,
    add: Iterable[ManifestEntry] = (),
    drop: Iterable[str] = (),
    points: Iterable[tuple[str, Point]] = (),
) -> Manifest:
    """Commit one change: ``add`` entries, ``drop`` the entries of these files, record
    ``points``; returns the manifest it makes. The caller holds ``manifest_lock``.
    A small manifest is rewritten; a large one gets a journal line (its first change starts
    the journal), and is rewritten once the journal has grown to a quarter of it (the cost
    per change stays flat)."""
    run_dir = Path(run_dir)
    with _writing(run_dir) as seen:
        change = {
            "add": [e.model_dump(mode="json") for e in add],
            "drop": sorted(set(drop)),
            "points": [[run, p.model_dump(mode="json")] for run, p in points],
        }
        seq = max(seen.journal.last, seen.base.journal) + 1
        state = seen.state.copy_out()
        state.apply({"seq": seq, **change})
        if seen.base_size + seen.journal.end < SMALL or seen.journal.end > seen.base_size // 4:
            # small: complete on its own; large: folded in, the journal emptied
            save(run_dir, state, seen.base.journal_id if seen.base_size >= SMALL else None)
            return state
        ident = seen.base.journal_id
        if ident is None:  # a large manifest's first change starts a journal
            save(run_dir, state, journal.new_id())
            return state
        if seen.journal.last < seen.base.journal:  # left by a compaction killed before its end
            first = journal.reset(run_dir, seen.base.journal, ident)
            _started(run_dir, seen, first, seen.base)
        written = journal.append(run_dir, seen.journal, change)
        st = os.stat(run_dir / journal.NAME, follow_symlinks=False)
        seen.journal_key = _key(st)
        seen.journal_tail = (seen.journal_tail + written)[-64:]
        seen.state = state.copy_out()
        return state


def compact(run_dir: Path) -> None:
    """Fold the journal into ``manifest.json`` and remove it, taking the manifest lock (the
    end of a run: ``manifest.json`` alone is then complete, for tools that read only it).
    Nothing happens, and no file is created, where there is no journal."""
    run_dir = Path(run_dir)
    if not os.path.lexists(run_dir / journal.NAME):
        return
    with manifest_lock(run_dir):
        seen = _current(run_dir)
        if seen.journal_key is not None:
            save(run_dir, seen.state)


def read_points(run_dir: str | Path) -> dict[str, list[Point]]:
    """Run id -> the points each run passed (empty for runs written before points were kept)."""
    return load(Path(run_dir)).points


def runs(run_dir: str | Path) -> list[str]:
    """Ids of the runs with entries in ``run_dir``, in order of their first entry."""
    return list(dict.fromkeys(e.run for e in read_manifest(run_dir)))


def run_entries(entries: list[ManifestEntry], run: str) -> list[ManifestEntry]:
    return [e for e in entries if e.run == run]


def latest_run(entries: list[ManifestEntry]) -> str | None:
    """The run that wrote the last entry."""
    return entries[-1].run if entries else None


def describe_runs(entries: list[ManifestEntry]) -> str:
    """'a1b2c3d4 (4 entries, epochs 1-4), ...' for error messages."""
    if not entries:
        return "no runs"
    parts = []
    for run in dict.fromkeys(e.run for e in entries):
        mine = run_entries(entries, run)
        epochs = sorted(e.epoch for e in mine)
        parts.append(f"{run} ({len(mine)} entries, epochs {', '.join(map(str, epochs))})")
    return "runs " + "; ".join(parts)
