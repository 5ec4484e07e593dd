"""Sources named in a run directory on object storage (``s3://bucket/prefix/run``).

A source is resolved against the manifest object exactly as against a disk's manifest (its
entries and its runs' points); the records it names (one, or an ``Average``'s picks) are then
copied down into the run directory's staging directory
(:func:`~nitro_core.store.object_run.staging`), where the record readers read them and check
every section against the manifest's digests as on a disk. A record file named by its name
must be one the manifest lists: an unlisted object is never read as a record.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from nitro_core.errors import ConfigError
from nitro_core.policy.retention import Pair as ScorePair
from nitro_core.sources.grammar import PathSource, Source, to_source
from nitro_core.sources.resolve import Resolved, resolve
from nitro_core.store import manifest, object_run, objects
from nitro_core.store.objects import ObjectUrl


def resolve_at(
    source: Source, run: ObjectUrl, pair: ScorePair | None = None, picks: bool = True
) -> Resolved:
    """``source`` resolved in the object-store run directory ``run``, the records it names
    copied down (their paths are in the staging directory); ``picks=False``: of an
    ``Average``, only its state record (whose header says what the average is)."""
    here = object_run.staging(run)
    state = object_run.load(run).manifest
    entries = list(state.entries)
    if isinstance(source, PathSource) and objects.is_url(source.path):
        record = objects.parse(source.path, "source")
        if record.parent != run:
            raise ConfigError(
                f"source={source.path!r} lies outside the run directory {str(run)!r}; name a "
                "record of it by its file name, e.g. 'epoch-0003.safetensors', or a pair such "
                "as 'latest => best'."
            )
        source = PathSource(record.name)
    if isinstance(source, PathSource) and not Path(source.path).is_absolute():
        entry = object_run.listed(run.child(source.path.rstrip("/")))  # unlisted: refused
        return Resolved(source, object_run.fetch_entry(run, entry, here), entry)
    resolved = resolve(source, here, entries, pair, state.points)
    fetch(run, resolved if picks else replace(resolved, picked=()))
    return resolved


def fetch(run: ObjectUrl, resolved: Resolved) -> None:
    """Copy down the listed records of ``run`` that ``resolved`` names (one, or an average's
    picks) into its staging directory, where ``resolved``'s paths point; a local record it
    names (an absolute path) stays where it is."""
    here = object_run.staging(run)
    named = resolved.picked or ((resolved.entry,) if resolved.entry is not None else ())
    for e in named:
        if resolved.picked or resolved.path == here / e.file:
            object_run.fetch_entry(run, e, here)


def resolve_in(
    source: Any, run_dir: str | Path | None, call: str, fix: str, picks: bool = True
) -> tuple[Source, Resolved]:
    """Parse ``source`` and resolve it in ``run_dir``, a local directory or
    ``s3://bucket/prefix/run`` (a path source needs none: its own directory is used). ``call``
    and ``fix`` are the caller's call as written and as it should be, with ``{src}`` for the
    source, for the refusal when ``run_dir`` is missing. ``picks``: see :func:`resolve_at`."""
    src = to_source(source, "source")
    if run_dir is None:
        if not isinstance(src, PathSource):
            shown = repr(str(src))
            raise ConfigError(
                f"{call.format(src=shown)} needs run_dir= to find the run; write "
                f"{fix.format(src=shown)}."
            )
        if objects.is_url(src.path):
            return src, resolve_at(src, objects.parse(src.path, "source").parent, None, picks)
        run_dir = Path(src.path).parent
    if objects.is_url(run_dir):
        return src, resolve_at(src, objects.parse(str(run_dir)), None, picks)
    run_dir = Path(run_dir)
    return src, resolve(src, run_dir, manifest.read_manifest(run_dir))


def run_dir_of(run_dir: str | Path) -> Path:
    """Where a run directory's records are read: a local path as it is, an object-store
    run directory's staging directory."""
    if objects.is_url(run_dir):
        return object_run.staging(objects.parse(str(run_dir)))
    return Path(run_dir)


__all__ = ["fetch", "resolve_at", "resolve_in", "run_dir_of"]
