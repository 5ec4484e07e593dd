"""Sources named in a run directory on object storage (``s3://bucket/prefix/run``).

A source is resolved against the manifest object exactly as against a disk's manifest (its
entries and its runs' points); the records it names (one, or an ``Average``'s picks) are then
copied down into the run directory's staging directory
(:func:`~nitro_core.store.object_run.staging`), where the record readers read them and check
every section against the manifest's digests as on a disk. A record file named by its name
must be one the manifest lists: an unlisted object is never read as a record.
"""

from __future__ import annotations

import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeGuard

from nitro_core.errors import ConfigError
from nitro_core.policy.retention import Pair as ScorePair
from nitro_core.sources.grammar import PathSource, Source, to_source
from nitro_core.sources.resolve import Resolved, resolve
from nitro_core.store import manifest, object_run, objects, record_header
from nitro_core.store.manifest import ManifestEntry
from nitro_core.store.objects import ObjectUrl


def resolve_at(
    source: Source,
    run: ObjectUrl,
    pair: ScorePair | None = None,
    picks: bool = True,
    copy: bool = True,
) -> Resolved:
    """``source`` resolved in the object-store run directory ``run``, the records it names
    copied down (their paths are in the staging directory); ``picks=False``: of an
    ``Average``, only its state record (whose header says what the average is);
    ``copy=False``: nothing (see :func:`weights_copies`). A record
    named by its URL is resolved in its own run directory; one named by a relative name is
    a record ``run`` lists; an absolute path is a local file."""
    here = object_run.staging(run)
    if _record_url(source):  # its own directory
        record = objects.parse(source.path, "source")
        run, here, source = (
            record.parent,
            object_run.staging(record.parent),
            PathSource(record.name),
        )
    if _record_name(source):
        entry = listed_entry(source, run)
        return Resolved(source, object_run.fetch_entry(run, entry, here) if copy else here /
                        entry.file, entry)  # fmt: skip
    state = object_run.load(run).manifest
    resolved = resolve(source, here, list(state.entries), pair, state.points, str(run))
    if copy:
        fetch(run, resolved if picks else replace(resolved, picked=()))
    return resolved


@contextmanager
def weights_copies(
    run: ObjectUrl, resolved: Resolved, sections: Collection[str]
) -> Iterator[tuple[Resolved, Path]]:
    """The records ``resolved`` names in ``run`` (an average's picks, or its one record),
    copied down with only ``sections`` (:func:`~nitro_core.store.object_run.fetch_sections`:
    an average never reads optimizer state) into a private directory, removed on exit (a
    tensor mapped from a copy stays valid); yields ``resolved`` pointing there, and it."""
    here = object_run.staging(run)
    here.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".weights-", dir=here) as tmp:
        private = Path(tmp)
        for e in _named(resolved):
            object_run.fetch_sections(run, e, private, sections)
        yield replace(resolved, path=private / resolved.path.name), private


def _record_url(source: object) -> TypeGuard[PathSource]:
    """A record named by its URL (``hf:`` names a local directory, never a URL)."""
    return type(source) is PathSource and objects.is_url(source.path)


def _record_name(source: object) -> TypeGuard[PathSource]:
    """A record named by its name in the run directory (not an absolute local path)."""
    return type(source) is PathSource and not Path(source.path).is_absolute()


def listed_entry(source: PathSource, run: ObjectUrl) -> ManifestEntry:
    """The entry of the record ``source`` names in ``run`` (by its URL, or its name there);
    a path below the run directory, or an object its manifest does not list, is refused."""
    name = objects.parse(source.path, "source").name if objects.is_url(source.path) else (
        source.path.rstrip("/"))  # fmt: skip
    if "/" in name or name in ("", ".", ".."):
        raise ConfigError(
            f"source={source.path!r} names a path below the run directory {str(run)!r}; "
            "name one of its records by its file name, e.g. 'epoch-0003.safetensors', or by "
            "its URL."
        )
    return object_run.listed(run.child(name))  # an unlisted object: refused


def _named(resolved: Resolved) -> tuple[ManifestEntry, ...]:
    """The listed records ``resolved`` names: an average's picks, or its one record."""
    return resolved.picked or ((resolved.entry,) if resolved.entry is not None else ())


def copied(
    run: ObjectUrl | None, resolved: Resolved, sections: Collection[str] | None = None
) -> Resolved:
    """``resolved`` readable here: where the record it names is one of the object-store run
    directory ``run`` (its path in the staging directory), copied down
    (:func:`~nitro_core.store.object_run.fetch_entry`): whole, or with ``sections`` alone
    (a weights load never fetches the optimizer's moments), its path then the copy's. A
    local record, or ``run`` None (a disk's run directory): as it is."""
    entry = resolved.entry
    if run is None or entry is None or resolved.path != object_run.staging(run) / entry.file:
        return resolved
    return replace(
        resolved, path=object_run.fetch_entry(run, entry, resolved.path.parent, sections)
    )


def fetch(run: ObjectUrl, resolved: Resolved) -> None:
    """Copy down the listed records of ``run`` that ``resolved`` names (one, or an average's
    picks) into its staging directory, where ``resolved``'s paths point; a local record it
    names (an absolute path) stays where it is."""
    here = object_run.staging(run)
    for e in _named(resolved):
        if resolved.picked or resolved.path == here / e.file:
            object_run.fetch_entry(run, e, here)


def header_at(source: Source, run: ObjectUrl) -> tuple[Resolved, str | Path, dict[str, Any]]:
    """The record ``source`` names in the object-store run directory ``run`` (an ``Average``:
    its state record; a record named by its URL: in its own run directory), where it lies
    (its URL; a local record named by its path: that path), and its header's metadata,
    checked against the manifest's digest: ranged reads of the header alone, nothing copied
    down (a call is checked before its job starts without fetching the record)."""
    home = objects.parse(source.path, "source").parent if _record_url(source) else run
    found = resolve_at(source, run, picks=False, copy=False)
    entry = found.entry
    if entry is not None and found.path == object_run.staging(home) / entry.file:
        url = home.child(entry.file)
        return found, str(url), object_run.read_header(url, entry.expected)
    return (
        found,
        found.path,
        record_header.read_header(found.path, entry.expected if entry else None),
    )


def header_in(
    source: Any, run_dir: str | Path | None, call: str, fix: str
) -> tuple[Resolved, str | Path, dict[str, Any]]:
    """:func:`header_at` for ``run_dir`` a local directory or ``s3://bucket/prefix/run``, as
    :func:`resolve_in` takes it: on a disk the record's path and its header read there."""
    src = to_source(source, "source")
    if _record_url(src):
        return header_at(src, objects.parse(src.path, "source").parent)
    if run_dir is not None and objects.is_url(run_dir):
        return header_at(src, objects.parse(str(run_dir)))
    _, found = resolve_in(src, run_dir, call, fix, picks=False)
    return (
        found,
        found.path,
        record_header.read_header(found.path, found.entry.expected if found.entry else None),
    )


def resolve_in(
    source: Any,
    run_dir: str | Path | None,
    call: str,
    fix: str,
    picks: bool = True,
    copy: bool = True,
) -> tuple[Source, Resolved]:
    """Parse ``source`` and resolve it in ``run_dir``, a local directory or
    ``s3://bucket/prefix/run`` (a path source needs none: its own directory is used). ``call``
    and ``fix`` are the caller's call as written and as it should be, with ``{src}`` for the
    source, for the refusal when ``run_dir`` is missing. ``picks`` and ``copy``: see
    :func:`resolve_at`."""
    src = to_source(source, "source")
    if _record_url(src):  # a record by its URL
        return src, resolve_at(src, objects.parse(src.path, "source").parent, None, picks, copy)
    if run_dir is None:
        if not isinstance(src, PathSource):
            shown = repr(str(src))
            raise ConfigError(
                f"{call.format(src=shown)} needs run_dir= to find the run; write "
                f"{fix.format(src=shown)}."
            )
        run_dir = Path(src.path).parent
    if objects.is_url(run_dir):
        return src, resolve_at(src, objects.parse(str(run_dir)), None, picks, copy)
    run_dir = Path(run_dir)
    return src, resolve(src, run_dir, manifest.read_manifest(run_dir))


__all__ = [
    "copied",
    "fetch",
    "header_at",
    "header_in",
    "listed_entry",
    "resolve_at",
    "resolve_in",
    "weights_copies",
]
