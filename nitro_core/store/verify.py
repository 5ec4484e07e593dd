"""Checking whole records, on a disk (:func:`verify_path`) and on object storage
(:func:`verify_objects`): ``nitro verify PATH|DIR`` and the ``nitro_verify`` tool, through
:mod:`nitro_core.verification` and :meth:`~nitro_core.store.place.Place.verify`.

A reader verifies the sections it reads (averaging never reads the optimizer state); this
reads every byte of every record it is given, so a corruption in a section no reader has
touched yet is found too. Records are files or record directories (an FSDP run's: a
``header.json`` and one safetensors shard per rank, :mod:`nitro_core.store.shards`), checked
alike.

- A run directory (it holds ``manifest.json``): every record its manifest lists (missing,
  wrong size, a link, the header against the manifest's digest, each section or shard
  against the header), then the records it does not list (against their own header's
  digest).
- A record (a file, or a record directory): the same, with its manifest entry when the
  directory beside it lists it.
- Any other directory: the records in it, and every run directory below it (``nitro verify
  runs/`` checks each run), never through a link or into a hidden directory.

Nothing found is an error (:class:`CheckpointMissing`), never "0 checked, all fine".
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from nitro_core.errors import CheckpointCorrupt, CheckpointMissing, UnsafePath
from nitro_core.store import manifest, object_run, objects, reclaim
from nitro_core.store.manifest_file import MANIFEST_NAME
from nitro_core.store.reader import RecordFile
from nitro_core.store.safeio import link_refusal
from nitro_core.store.shard_header import HEADER_NAME, SHARD_NAME

_SUFFIX = ".safetensors"
_PARTIAL = re.compile(r"\.tmp$|\.stale\d*$")  # an interrupted write's leftovers: no record
_SKIPPED = {"logs"}  # a run directory's log files


class Checked(BaseModel):
    """One record (a file or a record directory), checked byte for byte."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str = Field(description="The record, relative to the directory checked (or as given).")
    listed: bool = Field(description="Whether the manifest beside it lists it.")
    ok: bool
    bytes: int = Field(
        ge=0, description="Its size on disk, a directory's files summed (0 when missing)."
    )
    sections: list[str] = Field(description="The sections verified, e.g. params, optim.")
    problem: str | None = Field(default=None, description="What is wrong, when not ok.")


def verify_path(given: Path) -> list[Checked]:
    """Check every byte of the record ``given`` (a file or a record directory), or of every
    record in the run directory ``given`` (listed ones against the manifest too), or of every
    record in and below the directory ``given``; one :class:`Checked` per record, in manifest
    order, unlisted ones after. Raises :class:`CheckpointMissing` when it holds no record."""
    path = given.resolve() if given.is_symlink() else given  # a path the caller names: followed
    if _real_dir(path) and not _is_record_dir(path):
        checks = _tree(path)
        if not checks:
            raise CheckpointMissing(
                f"No records found under {str(given)!r}: "
                + (
                    "its manifest lists none and it holds no record."
                    if _has_manifest(path)
                    else "it holds no manifest.json and no record, nor does any directory below it."
                )
                + " Give a run directory or a record, e.g. nitro verify runs/Classifier."
            )
        return checks
    if not os.path.lexists(path):
        raise CheckpointMissing(
            f"Nothing to verify at {str(given)!r}: it is neither a record nor a run directory. "
            "Give a .safetensors record or a run directory, e.g. nitro verify runs/Classifier."
        )
    listed = {e.file: e for e in _entries(path.parent)}
    return [_check(path, str(given), listed.get(path.name))]


def verify_objects(url: objects.ObjectUrl) -> list[Checked]:
    """Check every byte of the listed record ``url`` (``s3://bucket/prefix/run/<record>``),
    or of every record the run directory ``url``'s manifest lists, each copied down to a
    temporary directory one at a time and checked there."""
    if url.name.endswith(_SUFFIX) and object_run.standalone(url):  # against its own digests
        with tempfile.TemporaryDirectory(prefix="nitro-verify-") as tmp:
            local = object_run.fetch_standalone(url, Path(tmp))
            checked = _check(local, url.name, None)
            if checked.problem is not None:  # the copy's path stands for the object
                problem = checked.problem.replace(str(local), str(url))
                checked = checked.model_copy(update={"problem": problem})
            return [checked]
    if url.name.endswith(_SUFFIX):
        pairs = [(url, object_run.listed(url))]
    else:
        entries = object_run.read_manifest(url)
        if (
            not entries
            and url.key
            and any(  # a record directory, named by its URL
                e.file == url.name for e in object_run.read_manifest(url.parent)
            )
        ):
            return _verify_objects_of([(url, object_run.listed(url))])
        if not entries:
            raise CheckpointMissing(
                f"No records found under {str(url)!r}: it holds no manifest, or one that lists "
                "none. Give a run directory or a record, e.g. nitro verify s3://bucket/runs/a."
            )
        pairs = [(url.child(e.file), e) for e in entries]
    return _verify_objects_of(pairs) + _leftovers(url)


def _leftovers(run: objects.ObjectUrl) -> list[Checked]:
    """What the run's next write or resume would reclaim (:mod:`nitro_core.store.reclaim`),
    each as a problem found: nothing lists it, and it holds bytes."""
    age = reclaim.age_s()
    out = []
    for x in object_run.reclaim(run, age, dry_run=True):
        what = (
            "an open multipart upload that no writer completed"
            if x.what == "upload"
            else "a record no manifest lists, left by a killed write"
        )
        out.append(Checked(
            file=x.name, listed=False, ok=False, bytes=x.bytes, sections=[],
            problem=f"{what} (older than {reclaim.AGE_VARIABLE}={age:g} s); the run's next "
            "write or resume removes it, and nothing reads it meanwhile.",
        ))  # fmt: skip
    return out


def _verify_objects_of(
    pairs: list[tuple[objects.ObjectUrl, manifest.ManifestEntry]],
) -> list[Checked]:
    out = []
    for record, entry in pairs:
        with tempfile.TemporaryDirectory(prefix="nitro-verify-") as tmp:
            try:
                local = object_run.fetch_entry(record.parent, entry, Path(tmp))
            except CheckpointMissing as exc:
                out.append(Checked(file=record.name, listed=True, ok=False, bytes=0, sections=[],
                                   problem=str(exc)))  # fmt: skip
                continue
            checked = _check(local, record.name, entry)
        if checked.problem is not None:  # the copy's path stands for the object
            checked = checked.model_copy(
                update={"problem": checked.problem.replace(str(local), str(record))}
            )
        out.append(checked)
    return out


def _entries(directory: Path) -> list[manifest.ManifestEntry]:
    try:
        return manifest.read_manifest(directory)
    except (CheckpointCorrupt, OSError):
        return []


def _tree(top: Path) -> list[Checked]:
    """Every record in ``top`` and below it, named relative to ``top``: a run directory's
    with its manifest; no link followed, no hidden directory entered."""
    out: list[Checked] = []
    pending = [(top, "")]
    while pending:
        directory, prefix = pending.pop(0)
        if _has_manifest(directory):
            out += _run_dir(directory, prefix)
            continue  # below a run directory: its records and logs, no other run
        out += _unlisted(directory, prefix, set())
        pending += [
            (directory / name, f"{prefix}{name}/")
            for name in _names(directory)
            if not name.startswith(".")
            and name not in _SKIPPED
            and not _PARTIAL.search(name)
            and _real_dir(directory / name)
            and not _is_record_dir(directory / name)
        ]
    return out


def _run_dir(run_dir: Path, prefix: str) -> list[Checked]:
    entries = manifest.read_manifest(run_dir)  # a corrupt manifest raises: nothing to trust
    out = [_check(run_dir / e.file, prefix + e.file, e) for e in entries]
    return out + _unlisted(run_dir, prefix, {e.file for e in entries})


def _unlisted(directory: Path, prefix: str, listed: set[str]) -> list[Checked]:
    """The records in ``directory`` no manifest lists: record files (a link among them is
    reported, not followed) and record directories."""
    out = []
    for name in _names(directory):
        if name in listed or name.startswith(".") or _PARTIAL.search(name):
            continue
        found = directory / name
        if (name.endswith(_SUFFIX) and (found.is_symlink() or found.is_file())) or (
            _real_dir(found) and _is_record_dir(found)
        ):
            out.append(_check(found, prefix + name, None))
    return out


def _names(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)  # a link to a directory is not one
    except OSError:
        return False


def _has_manifest(directory: Path) -> bool:
    return os.path.lexists(directory / MANIFEST_NAME)


def _is_record_dir(path: Path) -> bool:
    """A record directory (several processes wrote it): ``header.json``, or shard files
    and no manifest (a record whose header was lost)."""
    if os.path.lexists(path / HEADER_NAME):
        return True
    return not _has_manifest(path) and any(SHARD_NAME.match(name) for name in _names(path))


def _check(path: Path, name: str, entry: manifest.ManifestEntry | None) -> Checked:
    listed = entry is not None

    def bad(problem: str, size: int = 0, sections: list[str] | None = None) -> Checked:
        return Checked(
            file=name, listed=listed, ok=False, bytes=size, sections=sections or [],
            problem=problem,
        )  # fmt: skip

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return bad(f"{name!r} is listed by the manifest but not on disk.")
    if stat.S_ISLNK(st.st_mode):
        return bad(str(link_refusal(path)))
    if stat.S_ISDIR(st.st_mode):
        return _check_dir(path, name, entry)
    if entry is not None and entry.bytes != st.st_size:
        return bad(
            f"{name!r} holds {st.st_size} bytes; the manifest recorded {entry.bytes} when it "
            "was written (truncated, or bytes appended).",
            st.st_size,
        )
    sections: list[str] = []
    try:
        with RecordFile(path, entry.expected if entry is not None else None) as record:
            sections = record.section_names()
            record.verify()
    except (CheckpointCorrupt, UnsafePath) as exc:
        return bad(str(exc), st.st_size, sections)
    return Checked(file=name, listed=listed, ok=True, bytes=st.st_size, sections=sections)


def _check_dir(path: Path, name: str, entry: manifest.ManifestEntry | None) -> Checked:
    """A record directory: ``header.json`` against the manifest (or its own digest), the
    shard files it lists, each shard's bytes; then its size against the manifest."""
    from nitro_core.store import shards  # lazy: the shard reader imports torch

    listed = entry is not None
    size = _dir_bytes(path)
    try:
        sections = shards.verify(path, entry.expected if entry is not None else None)
    except CheckpointMissing:
        problem = (
            f"{name!r} is listed by the manifest, but its {shards.HEADER_NAME} is not on "
            "disk (deleted since it was written), so its shards cannot be checked. Load "
            "another checkpoint."
            if listed
            else f"{name!r} is a directory of shard files without {shards.HEADER_NAME}: not a "
            "committed record (deleted header, or a copy that lost it). Load another "
            "checkpoint."
        )
        return Checked(file=name, listed=listed, ok=False, bytes=size, sections=[], problem=problem)
    except (CheckpointCorrupt, UnsafePath) as exc:
        return Checked(
            file=name, listed=listed, ok=False, bytes=size, sections=[], problem=str(exc)
        )
    if entry is not None and entry.bytes != size:
        return Checked(
            file=name, listed=True, ok=False, bytes=size, sections=sections,
            problem=f"{name!r} holds {size} bytes in its files; the manifest recorded "
            f"{entry.bytes} when it was written.",
        )  # fmt: skip
    return Checked(file=name, listed=listed, ok=True, bytes=size, sections=sections)


def _dir_bytes(path: Path) -> int:
    """The sizes of a directory's regular files summed (links not followed)."""
    with os.scandir(path) as it:
        return sum(
            e.stat(follow_symlinks=False).st_size for e in it if e.is_file(follow_symlinks=False)
        )
