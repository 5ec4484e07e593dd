"""A file or directory a caller names by a path or a URL (a record to read, verify or
show; an export or a saved average to write), wherever it lives: :func:`place` is the one
place such a name decides its medium, as :func:`~nitro_core.store.run.open_run` is for a
run directory.

- :class:`LocalPlace`: a path on a disk. A record there is read where it lies (listed or
  not: an unlisted one is checked against its own header).
- :class:`ObjectPlace`: ``s3://bucket/prefix/...``. A record there is one its run
  directory's manifest lists (an unlisted object is never read as a record), read by ranged
  reads; a new file is sent whole once written, never over an existing object.
"""

from __future__ import annotations

import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nitro_core.errors import ConfigError
from nitro_core.store import claims, object_run, objects, record_header, verify
from nitro_core.store.objects import ObjectPath, ObjectUrl
from nitro_core.store.run import LocalRun, ObjectRun, RunStore
from nitro_core.store.verify import Checked


class Place(ABC):
    """A file or directory named by a caller."""

    shown: Path | ObjectPath  # as replies and messages name it

    def __str__(self) -> str:
        return str(self.shown)

    @abstractmethod
    def home(self) -> tuple[RunStore, str] | None:
        """The run directory a record named here lives in and its name there, where a
        record is read through its run directory's manifest (object storage); None: a
        record is read where it lies (a disk)."""

    @abstractmethod
    def header(self) -> dict[str, Any]:
        """The record's ``nitro`` metadata, from its header bytes alone."""

    @abstractmethod
    def verify(self) -> list[Checked]:
        """Every byte of the record, or of every record in the run directory (and, on a
        disk, in and below the directory), checked."""

    @abstractmethod
    def refuse_taken(self, what: str) -> None:
        """Refuse this as the name of a new file: it exists (or names no ``.safetensors``
        object); ``what`` names it in the refusal."""

    @abstractmethod
    def write_new(self, what: str, write: Callable[[Path], None]) -> Path | ObjectPath:
        """Write a new file here by calling ``write(path)``, refused before anything is
        written when it exists; returns :attr:`shown`."""

    @abstractmethod
    def local_path(self) -> Path | None:
        """The path on this machine's disk this names (None: nothing local backs it, an
        object store's object or prefix)."""

    @abstractmethod
    def same(self, other: Place) -> bool:
        """Whether ``other`` names the same file or directory (a path resolved, a URL as
        parsed)."""

    @abstractmethod
    def holds(self, text: str, bases: tuple[Path, ...]) -> bool:
        """Whether ``text`` names a record inside this run directory: by its URL (object
        storage), or by a path relative to one of ``bases`` (a disk)."""

    @abstractmethod
    def shown_from(self, root: Path) -> str:
        """As a reply names it: a path relative to ``root`` when inside it, a URL as it is."""

    @abstractmethod
    def run(self) -> RunStore:
        """This, named as a run directory."""


class LocalPlace(Place):
    def __init__(self, path: Path) -> None:
        self.path = path
        self.shown = path

    def home(self) -> tuple[RunStore, str] | None:
        return None

    def header(self) -> dict[str, Any]:
        path = self.path  # a path the caller names: followed
        return record_header.read_header(path.resolve() if path.is_symlink() else path)

    def verify(self) -> list[Checked]:
        return verify.verify_path(self.path)

    def refuse_taken(self, what: str) -> None:
        claims.refuse_existing(self.path, what)

    def write_new(self, what: str, write: Callable[[Path], None]) -> Path | ObjectPath:
        claims.refuse_existing(self.path, what)
        write(self.path)
        return self.path

    def local_path(self) -> Path | None:
        return self.path

    def same(self, other: Place) -> bool:
        theirs = other.local_path()
        return theirs is not None and theirs.resolve() == self.path.resolve()

    def holds(self, text: str, bases: tuple[Path, ...]) -> bool:
        if objects.is_url(text):
            return False  # an object, never a file of this directory
        return any(self.path in (base / text).resolve().parents for base in bases)

    def shown_from(self, root: Path) -> str:
        try:
            return str(self.path.resolve().relative_to(root))
        except ValueError:
            return str(self.path)

    def run(self) -> RunStore:
        return LocalRun(self.path)


class ObjectPlace(Place):
    def __init__(self, url: ObjectUrl) -> None:
        self.url = url
        self.shown = url.shown()

    def __str__(self) -> str:
        return str(self.url)

    def home(self) -> tuple[RunStore, str] | None:
        return ObjectRun(self.url.parent), self.url.name

    def header(self) -> dict[str, Any]:
        if object_run.standalone(self.url):  # written on its own: its own digests check it
            with tempfile.TemporaryDirectory(prefix="nitro-header-") as tmp:
                return record_header.read_header(object_run.fetch_standalone(self.url, Path(tmp)))
        return object_run.read_header(self.url, object_run.listed(self.url).expected)

    def verify(self) -> list[Checked]:
        return verify.verify_objects(self.url)

    def refuse_taken(self, what: str) -> None:
        object_run.refuse_taken(self.url, what)

    def write_new(self, what: str, write: Callable[[Path], None]) -> Path | ObjectPath:
        object_run.refuse_taken(self.url, what)
        with tempfile.TemporaryDirectory(prefix="nitro-put-") as tmp:
            local = Path(tmp) / self.url.name
            write(local)
            object_run.put_new(self.url, local, what)
        return self.shown

    def local_path(self) -> Path | None:
        return None

    def same(self, other: Place) -> bool:
        return isinstance(other, ObjectPlace) and other.url == self.url

    def holds(self, text: str, bases: tuple[Path, ...]) -> bool:
        try:
            url = named_url(text, "source")
        except ConfigError:  # not a URL Nitro reads: no record of the run directory
            return False
        return url is not None and url.parent == self.url

    def shown_from(self, root: Path) -> str:
        return str(self.url)

    def run(self) -> RunStore:
        return ObjectRun(self.url)


def place(text: str | Path, keyword: str = "path") -> Place:
    """What ``text`` names: ``s3://bucket/prefix/...`` on object storage (a URL of another
    scheme is refused, naming ``keyword``), else a local path."""
    if objects.is_url(text):
        return ObjectPlace(objects.parse(str(text), keyword))
    return LocalPlace(Path(text))


def shown_from(root: Path, text: str | Path) -> str:
    """``text`` as a reply names it (:meth:`Place.shown_from`): a URL as written."""
    if objects.is_url(text):
        return str(text)  # a URL as it is
    return LocalPlace(Path(text)).shown_from(root)


def named_url(text: object, keyword: str) -> ObjectUrl | None:
    """The object-store URL ``text`` names (a URL of another scheme is refused, naming
    ``keyword``), or None when it names a local path (or is no text): the one test a
    boundary confining what callers name (the gate: paths under its root, URLs under its
    storage) makes."""
    if not isinstance(text, str) or not objects.is_url(text):
        return None
    return objects.parse(text, keyword)


def on_disk(text: str, refusal: str) -> Path:
    """The local path ``text`` names, for what only a disk holds (a Hugging Face directory);
    a URL is refused with ``refusal``."""
    if objects.is_url(text):
        raise ConfigError(refusal)
    return Path(text)


def locate(text: str) -> tuple[RunStore, str] | None:
    """The run directory and name of the record ``text`` names where a record is read
    through its run directory (a URL); None where it is read where it lies (a path)."""
    return place(text, "source").home()


__all__ = [
    "LocalPlace",
    "ObjectPlace",
    "Place",
    "locate",
    "named_url",
    "on_disk",
    "place",
    "shown_from",
]
