"""Checking whole files: ``nitro verify PATH|RUN_DIR`` and the ``nitro_verify`` tool.

A reader verifies the sections it reads (averaging never reads the optimizer state); this
reads every byte of every record it is given, so a corruption in a section no reader has
touched yet is found too. For a run directory: every record its manifest lists (missing,
wrong size, header against the manifest's digest, each section against the header), and
the record files it does not list (against their own header). For a file: the same, with
its manifest entry when the directory beside it lists it. A record directory (written by
several processes) is checked shard file by shard file.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from nitro_core.errors import CheckpointCorrupt, CheckpointMissing, UnsafePath
from nitro_core.store import manifest
from nitro_core.store import recordio as store

_SUFFIX = ".safetensors"


class Checked(BaseModel):
    """One record file, checked byte for byte."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str = Field(description="The record, relative to the directory checked (or as given).")
    listed: bool = Field(description="Whether the manifest beside it lists it.")
    ok: bool
    bytes: int = Field(ge=0, description="Its size on disk (0 when missing).")
    sections: list[str] = Field(description="The sections verified, e.g. params, optim.")
    problem: str | None = Field(default=None, description="What is wrong, when not ok.")


def verify(path: str | Path) -> list[Checked]:
    """Check every byte of the record ``path``, or of every record in the run directory
    ``path`` (listed ones against the manifest too); one :class:`Checked` per file, in
    manifest order, unlisted files last. Raises :class:`CheckpointMissing` when ``path`` is
    neither."""
    path = Path(path)
    if path.is_dir() and not _is_record_dir(path):
        return _directory(path)
    if not path.exists():
        raise CheckpointMissing(
            f"Nothing to verify at {str(path)!r}: it is neither a record nor a run directory. "
            "Give a .safetensors record or a run directory, e.g. nitro verify runs/Classifier."
        )
    listed = {e.file: e for e in _entries(path.parent)}
    entry = listed.get(path.name)
    return [_check(path, str(path), entry)]


def _entries(directory: Path) -> list[manifest.ManifestEntry]:
    try:
        return manifest.read_manifest(directory)
    except (CheckpointCorrupt, OSError):
        return []


def _directory(run_dir: Path) -> list[Checked]:
    entries = manifest.read_manifest(run_dir)  # a corrupt manifest raises: nothing to trust
    out = [_check(run_dir / e.file, e.file, e) for e in entries]
    listed = {e.file for e in entries}
    for found in sorted(run_dir.iterdir()):
        if found.name not in listed and found.name.endswith(_SUFFIX) and found.is_file():
            out.append(_check(found, found.name, None))
    return out


def _is_record_dir(path: Path) -> bool:
    """A record written by several processes: a directory of shard files, no manifest."""
    return not (path / store.MANIFEST_NAME).exists() and any(path.glob(f"*{_SUFFIX}"))


def _check(path: Path, name: str, entry: manifest.ManifestEntry | None) -> Checked:
    listed = entry is not None
    if path.is_dir() and not path.is_symlink():
        return _shards(path, name, listed)
    try:
        size = path.lstat().st_size
    except FileNotFoundError:
        return Checked(
            file=name, listed=listed, ok=False, bytes=0, sections=[],
            problem=f"{name!r} is listed by the manifest but not on disk.",
        )  # fmt: skip
    if entry is not None and entry.bytes != size:
        return Checked(
            file=name, listed=True, ok=False, bytes=size, sections=[],
            problem=f"{name!r} holds {size} bytes; the manifest recorded {entry.bytes} when it "
            "was written (truncated, or bytes appended).",
        )  # fmt: skip
    sections: list[str] = []
    try:
        with store.RecordFile(path, entry.expected if entry is not None else None) as record:
            sections = record.section_names()
            record.verify()
    except (CheckpointCorrupt, CheckpointMissing, UnsafePath) as exc:
        return Checked(
            file=name, listed=listed, ok=False, bytes=size, sections=sections, problem=str(exc)
        )
    return Checked(file=name, listed=listed, ok=True, bytes=size, sections=sections)


def _shards(directory: Path, name: str, listed: bool) -> Checked:
    """A record directory: every shard file against its own header."""
    checks = [_check(p, p.name, None) for p in sorted(directory.glob(f"*{_SUFFIX}"))]
    bad = [c for c in checks if not c.ok]
    return Checked(
        file=name,
        listed=listed,
        ok=bool(checks) and not bad,
        bytes=sum(c.bytes for c in checks),
        sections=sorted({s for c in checks for s in c.sections}),
        problem=bad[0].problem if bad else None if checks else f"{name!r} holds no shard file.",
    )
