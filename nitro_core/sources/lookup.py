"""Sources resolved in a run directory, wherever it lives (a :class:`RunStore`).

A source is resolved against the run directory's manifest (its entries and its runs'
points); the records it names (one, or an ``Average``'s picks) are then made readable here
(:meth:`RunStore.fetch`: on a disk where they lie, on object storage copied down into the
staging directory), where the record readers check every section against the manifest's
digests. A record named by its URL is resolved in its own run directory; one named by its
name where the store lists records by name alone must be listed (an unlisted object is
never read as a record).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from nitro_core.errors import ConfigError
from nitro_core.policy.retention import Pair as ScorePair
from nitro_core.sources.grammar import PathSource, Source, to_source
from nitro_core.sources.resolve import Resolved, resolve
from nitro_core.store import record_header
from nitro_core.store.manifest import ManifestEntry
from nitro_core.store.place import locate
from nitro_core.store.run import RunStore, open_run


def home_of(source: Source, run: RunStore) -> tuple[RunStore, Source]:
    """The run directory ``source`` is resolved in, and the source as named there: a
    record named by its URL, in its own run directory by its name; else ``run``."""
    path = source.record_path()
    located = locate(path) if path is not None else None
    if located is None:
        return run, source
    home, name = located
    return home, PathSource(name)


def shown_record(run: RunStore, path: Path) -> str | Path:
    """The record at ``path`` (as read here) as a reply or a header names it: a record of
    ``run`` where it lies (on object storage its URL, never the staging copy); anything
    else by its path."""
    return run.record(path.name) if run.holds(path) else path


def named_entry(source: Source, run: RunStore) -> ManifestEntry | None:
    """The listed entry a record source names in ``run`` by its name, where ``run`` finds
    records by their listed name alone (object storage); None: resolved by its path."""
    path = source.record_path()
    return run.named(path) if path is not None else None


def resolve_at(
    source: Source,
    run: RunStore,
    pair: ScorePair | None = None,
    picks: bool = True,
    copy: bool = True,
) -> Resolved:
    """``source`` resolved in the run directory ``run``, the records it names made readable
    here (:meth:`RunStore.fetch`); ``picks=False``: of an ``Average``, only its state record
    (whose header says what the average is); ``copy=False``: nothing fetched (see
    :func:`weights_copies`)."""
    run, source = home_of(source, run)
    entry = named_entry(source, run)
    if entry is not None:
        return Resolved(source, run.fetch(entry) if copy else run.local / entry.file, entry)
    state = run.state()
    resolved = resolve(source, run.local, list(state.entries), pair, state.points, str(run))
    if copy:
        fetch(run, resolved if picks else replace(resolved, picked=()))
    return resolved


@contextmanager
def weights_copies(
    run: RunStore, resolved: Resolved, sections: Collection[str]
) -> Iterator[tuple[Resolved, Path]]:
    """The records ``resolved`` names in ``run`` (an average's picks, or its one record)
    readable with ``sections`` at least (:meth:`RunStore.fetch_sections`: an average never
    reads optimizer state), in a directory removed on exit where copies are made (a tensor
    mapped from a copy stays valid); yields ``resolved`` pointing there, and it."""
    with run.private_copies() as private:
        for e in _named(resolved):
            run.fetch_sections(e, private, sections)
        yield replace(resolved, path=private / resolved.path.name), private


def _named(resolved: Resolved) -> tuple[ManifestEntry, ...]:
    """The listed records ``resolved`` names: an average's picks, or its one record."""
    return resolved.picked or ((resolved.entry,) if resolved.entry is not None else ())


def copied(run: RunStore, resolved: Resolved, sections: Collection[str] | None = None) -> Resolved:
    """``resolved`` readable here: where the record it names is one of ``run``'s, made
    readable (:meth:`RunStore.fetch`): whole, or with ``sections`` alone (a weights load
    never fetches the optimizer's moments), its path then the copy's. A record elsewhere:
    as it is."""
    entry = resolved.entry
    if entry is None or resolved.path != run.local / entry.file:
        return resolved
    return replace(resolved, path=run.fetch(entry, resolved.path.parent, sections))


def fetch(run: RunStore, resolved: Resolved) -> None:
    """Make readable the listed records of ``run`` that ``resolved`` names (one, or an
    average's picks) where ``resolved``'s paths point; a record elsewhere (an absolute
    path) stays where it is."""
    for e in _named(resolved):
        if resolved.picked or resolved.path == run.local / e.file:
            run.fetch(e)


def header_at(source: Source, run: RunStore) -> tuple[Resolved, str | Path, dict[str, Any]]:
    """The record ``source`` names in ``run`` (an ``Average``: its state record; a record
    named by its URL: in its own run directory), where it lies (:meth:`RunStore.record`; a
    record elsewhere: its path), and its header's metadata, checked against the manifest's
    digest: the header alone is read (by ranged reads on object storage), nothing is
    fetched (a call is checked before its job starts without fetching the record)."""
    home, _ = home_of(source, run)
    found = resolve_at(source, run, picks=False, copy=False)
    entry = found.entry
    if entry is not None and found.path == home.local / entry.file:
        return found, shown_record(home, found.path), home.header(entry)
    return (
        found,
        found.path,
        record_header.read_header(found.path, entry.expected if entry else None),
    )


def run_of(source: Source, run_dir: str | Path | RunStore | None, call: str, fix: str) -> RunStore:
    """The run directory a source is resolved in: ``run_dir`` (a path, a URL or a store);
    without one, the directory of the record the source names by its path. ``call`` and
    ``fix`` are the caller's call as written and as it should be, with ``{src}`` for the
    source, for the refusal when a pair has no run directory."""
    if run_dir is not None:
        return open_run(run_dir)
    path = source.record_path() or source.hf_directory()
    if source.needs_manifest() or path is None:
        shown = repr(str(source))
        raise ConfigError(
            f"{call.format(src=shown)} needs run_dir= to find the run; write "
            f"{fix.format(src=shown)}."
        )
    located = locate(path)
    return located[0] if located is not None else open_run(Path(path).parent)


def header_in(
    source: Any, run_dir: str | Path | RunStore | None, call: str, fix: str
) -> tuple[Resolved, str | Path, dict[str, Any]]:
    """:func:`header_at` for ``run_dir`` as :func:`resolve_in` takes it."""
    src = to_source(source, "source")
    return header_at(src, run_of(src, run_dir, call, fix))


def resolve_in(
    source: Any,
    run_dir: str | Path | RunStore | None,
    call: str,
    fix: str,
    picks: bool = True,
    copy: bool = True,
) -> tuple[Source, Resolved]:
    """Parse ``source`` and resolve it in ``run_dir`` (:func:`run_of`). ``picks`` and
    ``copy``: see :func:`resolve_at`."""
    src = to_source(source, "source")
    return src, resolve_at(src, run_of(src, run_dir, call, fix), None, picks, copy)


__all__ = [
    "copied",
    "fetch",
    "header_at",
    "header_in",
    "home_of",
    "named_entry",
    "resolve_at",
    "resolve_in",
    "run_of",
    "shown_record",
    "weights_copies",
]
