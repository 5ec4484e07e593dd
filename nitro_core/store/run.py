"""A run directory, wherever it lives: one interface, a disk and an object-store
implementation (DESIGN section 17).

:class:`RunStore` is what the handle, the sources, averaging, export, deletion, verification,
info, transfer, the gate and the CLI hold; none of them asks which medium it is.

- :class:`LocalRun`: a directory on a disk (atomic rename, the manifest's journal, ``flock``):
  :mod:`~nitro_core.store.manifest`, :mod:`~nitro_core.store.removal`,
  :mod:`~nitro_core.store.claims`.
- :class:`ObjectRun`: ``s3://bucket/prefix/run`` (conditional writes, immutable objects):
  :mod:`~nitro_core.store.object_run`, the commit protocol's object-store finalizer. Its
  records are written and read in a local staging directory (:attr:`RunStore.local`).

:func:`open_run` is the one place a run directory's name decides its medium
(:func:`~nitro_core.store.place.place` does the same for a file or directory a caller names).
"""

from __future__ import annotations

import contextlib
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator
from functools import partial
from pathlib import Path, PurePath
from typing import Any, TypeVar

from nitro_core.errors import ConfigError, TrainingRefused
from nitro_core.store import (
    claims,
    digest,
    manifest,
    object_run,
    objects,
    reclaim,
    record_header,
    removal,
    safeio,
)
from nitro_core.store.manifest import Manifest, ManifestEntry, Point, point_of
from nitro_core.store.objects import ObjectUrl
from nitro_core.store.reclaim import Leftover
from nitro_core.store.removal import Doomed, Removed

T = TypeVar("T")
P = TypeVar("P", bound=Doomed)
Retention = Callable[[list[ManifestEntry]], set[str]]  # entries -> the files it unlists


class RunStore(ABC):
    """A run directory: its manifest, commits to it, its records published, fetched and
    removed, names claimed, and its lock."""

    local: Path  # where this process reads and writes the run's records and logs
    shown: PurePath  # the run directory as messages and replies name it
    spare_names: int  # more run-suffixed names a record may take (killed writes hold some)

    def __str__(self) -> str:
        return str(self.shown)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunStore) and str(other) == str(self)

    def __hash__(self) -> int:
        return hash(str(self))

    # -- reads -------------------------------------------------------------------------------
    @abstractmethod
    def exists(self) -> bool:
        """Whether the run directory can hold a manifest here: a directory on a disk; on
        object storage, any prefix."""

    @abstractmethod
    def state(self) -> Manifest:
        """The manifest: every entry in commit order and every run's points."""

    def entries(self) -> list[ManifestEntry]:
        """The entries of the manifest in commit order (empty when there is none)."""
        return list(self.state().entries)

    def points(self) -> dict[str, list[Point]]:
        """Run id -> the points each run passed."""
        return self.state().points

    @abstractmethod
    def listed(self, name: str) -> ManifestEntry | None:
        """The entry of the record ``name`` (a file name in the run directory); None where
        the manifest does not list it and an unlisted file may still be read (a disk)."""

    @abstractmethod
    def header(self, entry: ManifestEntry) -> dict[str, Any]:
        """A listed record's ``nitro`` metadata, checked against the manifest's digest,
        without reading (or fetching) its tensors."""

    @abstractmethod
    def fetch(
        self,
        entry: ManifestEntry,
        into: Path | None = None,
        sections: Collection[str] | None = None,
    ) -> Path:
        """A local path of the listed record ``entry``, readable here (its readers check it
        against the manifest's digest); ``into`` (default :attr:`local`) receives a copy
        where one is made; ``sections`` (params, buffers, EMA): a copy of those at least."""

    @abstractmethod
    def fetch_sections(self, entry: ManifestEntry, into: Path, sections: Collection[str]) -> Path:
        """A private copy in ``into`` of ``entry`` holding ``sections`` at least, or, where
        records are local already, the record's own path."""

    @abstractmethod
    def named(self, path: str) -> ManifestEntry | None:
        """The listed entry of the record ``path`` names, where this store finds records by
        their listed name alone (an object store: an unlisted or nested name is refused);
        None: the path is resolved as a path (a disk; an absolute local path; on object
        storage a record written on its own, under a prefix without a manifest, which is
        copied down where the path resolves: :meth:`unlisted`)."""

    @abstractmethod
    def private_copies(self) -> contextlib.AbstractContextManager[Path]:
        """A directory for copies of some sections of records (:meth:`fetch_sections`),
        removed on exit where copies are made."""

    @abstractmethod
    def record(self, name: str) -> str | Path:
        """Where the record ``name`` lies, as a reply names it."""

    def holds(self, path: Path) -> bool:
        """Whether ``path`` is a record of this run directory as read here."""
        return path.parent == self.local

    @abstractmethod
    def unlisted(self, name: str) -> Path:
        """A readable copy of the record ``name`` that no manifest lists, where one may be
        read (a disk's file; on object storage a record written on its own, under a prefix
        without a manifest): its readers check it against its own header's digests."""

    # -- writes ------------------------------------------------------------------------------
    @abstractmethod
    def check_writable(self) -> None:
        """Refuse, before anything starts, a run directory this process cannot write in (a
        disk's permissions; an object store answers at its first write)."""

    @abstractmethod
    def lock(self) -> contextlib.AbstractContextManager[None]:
        """Held while a writer decides a name from the manifest and claims it."""

    @abstractmethod
    def commit(self, change: Callable[[Manifest], T]) -> T:
        """Apply ``change`` to the current manifest and commit it (on a lost race, to the
        manifest then current: it decides from what it is given). Returns what it returned."""

    @abstractmethod
    def add_point(self, run: str, point: Point) -> None:
        """Record a point no selector keeps in ``run``'s history."""

    @abstractmethod
    def publish(
        self, local: Path, entry: ManifestEntry, retention: Retention, *, sent: bool = False
    ) -> ManifestEntry | None:
        """List the durable record ``local`` (written under the name ``entry.file`` claimed
        for it) and unlist what ``retention`` decides from the entries then listed; delete
        the files unlisted. ``sent``: its bytes are on the store already (every rank sent its
        shard). Returns the entry listed, or None when retention dropped it at once."""

    @abstractmethod
    def claim(self, name: str, run: str) -> bool:
        """Claim the name of a record directory for ``run`` beyond the local claim (a prefix
        no object lies under); False: take the next name."""

    def shard_sender(self, name: str) -> Callable[[Path], None] | None:
        """What sends a rank's shard of the record directory ``name`` once written (None:
        it stays where it was written)."""
        return None

    @abstractmethod
    def seal(
        self, tmp: Path, path: Path, meta: dict[str, Any], digests: dict[str, str]
    ) -> tuple[int, str]:
        """Rank 0, once every rank's shard is written (in ``tmp``, or sent): make the record
        directory whole under ``path``'s name, its ``header.json`` naming each shard's
        digest last; (its bytes, the manifest's digest)."""

    @abstractmethod
    def no_name(self, run: str, name: str, tried: int, taken: str) -> TrainingRefused:
        """The refusal when none of the ``tried`` names for ``name`` could be claimed."""

    @abstractmethod
    def reclaim(self, dry_run: bool = False) -> list[Leftover]:
        """Remove (``dry_run``: only say) the run directory's leftovers of killed writes
        (:mod:`nitro_core.store.reclaim`): unlisted records of its runs older than
        ``NITRO_RECLAIM_AFTER_S``, and on object storage open multipart uploads."""

    @abstractmethod
    def compact(self) -> None:
        """The end of a run's writes: the manifest complete in one document again."""

    @abstractmethod
    def remove(self, decide: Callable[[Manifest], P], dry_run: bool = True) -> tuple[P, Removed]:
        """Decide from the manifest, then (unless ``dry_run``) unlist the plan's entries and
        the points of its whole runs, and delete their files."""


class LocalRun(RunStore):
    """A run directory on a disk."""

    spare_names = 0

    def __init__(self, directory: str | Path) -> None:
        self.local = Path(directory)
        self.shown = self.local

    def exists(self) -> bool:
        return self.local.is_dir()

    def state(self) -> Manifest:
        return manifest.load(self.local)

    def entries(self) -> list[ManifestEntry]:
        return manifest.read_manifest(self.local)

    def listed(self, name: str) -> ManifestEntry | None:
        return next((e for e in self.entries() if e.file == name), None)

    def header(self, entry: ManifestEntry) -> dict[str, Any]:
        return record_header.read_header(self.local / entry.file, entry.expected)

    def fetch(
        self,
        entry: ManifestEntry,
        into: Path | None = None,
        sections: Collection[str] | None = None,
    ) -> Path:
        return self.local / entry.file

    def fetch_sections(self, entry: ManifestEntry, into: Path, sections: Collection[str]) -> Path:
        return self.local / entry.file

    def named(self, path: str) -> ManifestEntry | None:
        return None

    def private_copies(self) -> contextlib.AbstractContextManager[Path]:
        return contextlib.nullcontext(self.local)  # records are read where they lie

    def unlisted(self, name: str) -> Path:
        return self.local / name  # read where it lies

    def record(self, name: str) -> str | Path:
        return self.local / name

    def lock(self) -> contextlib.AbstractContextManager[None]:
        return claims.manifest_lock(self.local)

    def commit(self, change: Callable[[Manifest], T]) -> T:
        with claims.manifest_lock(self.local):
            state = manifest.load(self.local).copy_out()
            result = change(state)
            manifest.save(self.local, state)
        return result

    def add_point(self, run: str, point: Point) -> None:
        with claims.manifest_lock(self.local):
            manifest.commit(self.local, points=[(run, point)])

    def publish(
        self, local: Path, entry: ManifestEntry, retention: Retention, *, sent: bool = False
    ) -> ManifestEntry | None:
        with claims.manifest_lock(self.local):
            current = manifest.load(self.local)
            current.entries.append(entry)
            doomed = retention(current.entries)
            manifest.commit(
                self.local, add=[entry], drop=doomed, points=[(entry.run, point_of(entry))]
            )
            # deleted under the lock: once unlisted, a name may be claimed by another writer
            for file in sorted(doomed):
                claims.remove_file(self.local / file)
        return None if entry.file in doomed else entry

    def claim(self, name: str, run: str) -> bool:
        return True

    def seal(
        self, tmp: Path, path: Path, meta: dict[str, Any], digests: dict[str, str]
    ) -> tuple[int, str]:
        from nitro_core.store import shards  # lazy: it imports torch

        return shards.publish(tmp, path, meta, digests)

    def no_name(self, run: str, name: str, tried: int, taken: str) -> TrainingRefused:
        return TrainingRefused(
            f"Run {run} cannot write {name!r} in {str(self)!r}: " + taken.format(run=run)
        )

    def check_writable(self) -> None:
        safeio.check_writable(self.local)

    def reclaim(self, dry_run: bool = False) -> list[Leftover]:
        if not self.local.is_dir():
            return []
        age = reclaim.age_s()
        with self.lock():  # a writer names and lists records under it
            found = reclaim.on_disk(self.local, self.state(), age)
            if not dry_run:
                for leftover in found:
                    claims.remove_file(self.local / leftover.name)
        return found

    def compact(self) -> None:
        manifest.compact(self.local)

    def remove(self, decide: Callable[[Manifest], P], dry_run: bool = True) -> tuple[P, Removed]:
        return removal.remove(self.local, decide, dry_run)


class ObjectRun(RunStore):
    """A run directory on object storage; its records pass through a staging directory."""

    spare_names = 7

    def __init__(self, url: ObjectUrl) -> None:
        self.url = url
        self.local = object_run.staging(url)
        self.shown = url.shown()

    @classmethod
    def at(cls, text: str, keyword: str) -> ObjectRun:
        """The run directory on object storage ``text`` names (anything else is refused,
        naming ``keyword``)."""
        return cls(objects.parse(text, keyword))

    def copy(
        self, local: Path, entry: ManifestEntry, retention: Retention | None
    ) -> ManifestEntry | None:
        """List a copy of the local record ``local`` (``nitro push``): sent whole, listed
        unless its run lists it already (see :func:`~nitro_core.store.object_run.list_entry`)."""
        return object_run.publish(self.url, local, entry, retention, copy=True)

    def __str__(self) -> str:
        return str(self.url)

    def exists(self) -> bool:
        return True  # a prefix is there once anything is written under it

    def state(self) -> Manifest:
        return object_run.load(self.url).manifest

    def listed(self, name: str) -> ManifestEntry | None:
        record = self.url.child(name)
        if object_run.standalone(record):
            return None  # no manifest here: a record written on its own, read as on a disk
        return object_run.listed(record)  # an unlisted object beside a manifest: refused

    def unlisted(self, name: str) -> Path:
        return object_run.fetch_standalone(self.url.child(name), self.local)

    def header(self, entry: ManifestEntry) -> dict[str, Any]:
        return object_run.read_header(self.url.child(entry.file), entry.expected)

    def fetch(
        self,
        entry: ManifestEntry,
        into: Path | None = None,
        sections: Collection[str] | None = None,
    ) -> Path:
        return object_run.fetch_entry(self.url, entry, into or self.local, sections)

    def fetch_sections(self, entry: ManifestEntry, into: Path, sections: Collection[str]) -> Path:
        return object_run.fetch_sections(self.url, entry, into, sections)

    def named(self, path: str) -> ManifestEntry | None:
        if Path(path).is_absolute():
            return None  # a local file
        name = path.rstrip("/")
        if "/" in name or name in ("", ".", ".."):
            raise ConfigError(
                f"source={path!r} names a path below the run directory {str(self)!r}; "
                "name one of its records by its file name, e.g. 'epoch-0003.safetensors', or "
                "by its URL."
            )
        entry = self.listed(name)
        if entry is None:  # a record written on its own: copied to where a path resolves
            self.unlisted(name)
        return entry

    @contextlib.contextmanager
    def private_copies(self) -> Iterator[Path]:
        self.local.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".weights-", dir=self.local) as tmp:
            yield Path(tmp)

    def record(self, name: str) -> str | Path:
        return str(self.url.child(name))

    def lock(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # conditional replaces: a lost race decides again

    def commit(self, change: Callable[[Manifest], T]) -> T:
        return object_run.commit(self.url, change)

    def add_point(self, run: str, point: Point) -> None:
        object_run.commit(self.url, lambda state: state.add_point(run, point))

    def publish(
        self, local: Path, entry: ManifestEntry, retention: Retention, *, sent: bool = False
    ) -> ManifestEntry | None:
        if sent:
            return object_run.list_entry(self.url, entry, retention)
        try:
            return object_run.publish(self.url, local, entry, retention)
        finally:
            claims.remove_file(local)  # the staging copy goes either way

    def claim(self, name: str, run: str) -> bool:
        return object_run.claim_prefix(self.url, name, run)

    def shard_sender(self, name: str) -> Callable[[Path], None]:
        return partial(object_run.upload_shard, self.url, name)

    def seal(
        self, tmp: Path, path: Path, meta: dict[str, Any], digests: dict[str, str]
    ) -> tuple[int, str]:
        from nitro_core.store import shards  # lazy: it imports torch

        raw = shards.header_json(meta, digests)
        size = object_run.seal_directory(self.url, path.name, raw, sorted(digests))
        shards.remove_tree(tmp)  # each rank removed its shard once sent
        return size, digest.tree(raw)

    def no_name(self, run: str, name: str, tried: int, taken: str) -> TrainingRefused:
        return TrainingRefused(
            f"Run {run} cannot write {name!r} in {str(self)!r}: objects lie under each of the "
            f"{tried} names tried (leftovers of killed writes, which no manifest lists). "
            "Delete the objects the manifest does not list "
            f"(nitro verify {self} names them), then continue with resume='auto'."
        )

    def check_writable(self) -> None:
        pass  # the store answers at the first write (credentials, a policy): said then

    def reclaim(self, dry_run: bool = False) -> list[Leftover]:
        return object_run.reclaim(self.url, reclaim.age_s(), dry_run)

    def compact(self) -> None:
        pass  # the manifest object is always one complete document

    def remove(self, decide: Callable[[Manifest], P], dry_run: bool = True) -> tuple[P, Removed]:
        return object_run.remove(self.url, decide, dry_run)


def open_run(where: str | Path | RunStore) -> RunStore:
    """The run directory ``where`` names: ``s3://bucket/prefix/run`` on object storage, else
    a local directory (a URL of another scheme is refused)."""
    if isinstance(where, RunStore):
        return where
    if objects.is_url(where):
        return ObjectRun(objects.parse(str(where)))
    return LocalRun(where)


__all__ = [
    "LocalRun",
    "ObjectRun",
    "Retention",
    "RunStore",
    "open_run",
]
