"""The one commit protocol: every file Nitro commits (a record, ``manifest.json``, the
journal's reset, an average, an export, a job's files) and every record directory is
written to a temporary beside its name, made durable, and published under the name in one
step by a finalizer, so a reader (or a machine back from a power loss) finds the old state
or the new, never a part. Modelled on orbax-checkpoint's ``_src/path/atomicity.py``: a
temporary path with a finalizer.

The steps, in this order (:meth:`_LocalTarget.commit`; each has its mutation row):

1. write the temporary (``<name>.tmp``, opened without following a link), flush, ``fsync``;
2. the last check before publishing (:class:`Reserved`: room to rewrite the manifest), or,
   for a directory, ``fsync`` of the temporary directory (its entries);
3. publish: the finalizer's rename or link;
4. ``fsync`` the directory that holds the name (the rename or link survives a power loss).

Finalizers, one class each:

- :class:`Replace`: ``rename`` over the name (``manifest.json``, the journal's reset, job
  files); a failure removes the ``.tmp`` and keeps the old file.
- :class:`Reserved`: ``rename`` of a record a manifest will list, into the ``.tmp`` that
  :func:`nitro_core.store.claims.reserve` created and holds ``flock``-ed (the lock follows
  the inode through the rename until the entry is committed); its caller removes the
  ``.tmp`` when the commit raises.
- :class:`PublishNew`: ``link`` under a name that must be new (averages, exports): unlike a
  rename it fails when the name exists, so two writers of one name never both succeed, and
  a published file is never overwritten. The ``.tmp`` is the name's claim: ``flock``-ed,
  checked to be the file at that name, and unlinked before its lock drops.
- :class:`PublishDirectory`: ``rename`` of a record directory whose files other processes
  wrote and fsynced into ``<name>.tmp/``; the commit writes its last file (``header.json``).
  With ``new=True`` (a Hugging Face export) the name must be new, as for :class:`PublishNew`.

A target on object storage (DESIGN section 14) is one more subclass of :class:`Target`: its
``commit`` streams the bytes and finalizes with one conditional PUT (``If-None-Match: *``
for a record, written once under a fresh name; ``If-Match`` the ETag it read for the
manifest), with no rename and no directory to fsync.
"""

from __future__ import annotations

import fcntl
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import IO, TypeVar

from nitro_core.errors import ConfigError, DiskFull
from nitro_core.store import deleter, safeio

T = TypeVar("T")
Fill = Callable[[IO[bytes]], T]  # writes a commit's bytes into the open temporary

TMP_SUFFIX = ".tmp"


def tmp_path(path: Path) -> Path:
    """Where the bytes of ``path`` are written before they are published: ``<name>.tmp``."""
    return path.with_name(path.name + TMP_SUFFIX)


class Target(ABC):
    """A name committed atomically: :meth:`commit` runs ``fill(file)`` and publishes what it
    wrote under :attr:`path`, or raises with the name as it was."""

    path: Path

    @abstractmethod
    def commit(self, fill: Fill[T]) -> T:
        """Write through ``fill`` and publish; returns what ``fill`` returned."""


class _LocalTarget(Target):
    """On a local file system: the temporary beside the name, then the four steps of the
    module docstring. A finalizer fills in the hooks."""

    def __init__(self, path: Path, tmp: Path | None = None) -> None:
        self.path = Path(path)
        self.tmp = tmp_path(self.path) if tmp is None else Path(tmp)

    def commit(self, fill: Fill[T]) -> T:
        fd = self._open()
        try:
            try:
                with os.fdopen(os.dup(fd), "wb") as f:
                    result = fill(f)
                    f.flush()
                    os.fsync(f.fileno())  # 1. the bytes are durable before a name shows them
                self._ready()  # 2.
                self._publish()  # 3.
            except BaseException as exc:
                failure = self._failed(exc)
                if failure is exc:
                    raise
                raise failure from None
            finally:
                self._settle(fd)
        finally:
            self._close(fd)
        safeio.fsync_dir(self.path.parent)  # 4. the rename or link survives a power loss
        return result

    @abstractmethod
    def _open(self) -> int:
        """The open temporary (checks that come before any byte is written go here)."""

    def _ready(self) -> None:
        """The last step before publishing; nothing by default."""

    def _publish(self) -> None:
        """Put the temporary under :attr:`path` in one step: by default a rename over it."""
        os.replace(self.tmp, self.path)

    def _failed(self, exc: BaseException) -> BaseException:
        """What a failed commit raises (``exc`` itself by default), after any cleanup."""
        return exc

    def _settle(self, fd: int) -> None:
        """After the commit, whether it succeeded or not, before ``fd`` is closed."""

    def _close(self, fd: int) -> None:
        os.close(fd)


class Replace(_LocalTarget):
    """Rename over the name (which may exist): ``manifest.json``, the journal's reset, job
    files. The ``.tmp`` is never followed through a link, and is removed when anything
    fails; a full disk raises ``disk_full(free bytes)`` (by default a :class:`DiskFull`
    saying that the file was kept as it was)."""

    def __init__(self, path: Path, disk_full: Callable[[int], DiskFull] | None = None) -> None:
        super().__init__(path)
        self.disk_full = disk_full or _kept_as_it_was(self.path)

    def _open(self) -> int:
        return safeio.open_nofollow(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)

    def _failed(self, exc: BaseException) -> BaseException:
        deleter.remove(self.tmp)
        if _full(exc):
            return self.disk_full(safeio.free_bytes(self.path.parent))
        return exc


class Reserved(_LocalTarget):
    """Rename a record a manifest will list into place, from the ``.tmp`` a reservation
    created and holds locked (``fd``, which stays open: the reservation releases it). There
    must be room for the record and ``room()`` bytes more (to rewrite ``manifest.json``)
    before a byte is written, and ``room()`` again before the rename. The caller removes the
    ``.tmp`` when this raises; a full disk is :func:`~nitro_core.store.safeio.no_room`."""

    def __init__(self, path: Path, fd: int, total: int, room: Callable[[], int]) -> None:
        super().__init__(path)
        self.fd, self.total, self.room = fd, total, room

    def _open(self) -> int:
        room = self.room()
        detail = f" ({self.total} for the record, {room} to rewrite manifest.json)"
        safeio.require_room(self.path, self.total + room, detail)
        return self.fd

    def _ready(self) -> None:  # other writers may have taken space meanwhile
        detail = " to rewrite manifest.json after it is written"
        safeio.require_room(self.path, self.room(), detail)

    def _failed(self, exc: BaseException) -> BaseException:
        if _full(exc):
            return safeio.no_room(self.path, self.total, safeio.free_bytes(self.path.parent))
        return exc

    def _close(self, fd: int) -> None:
        """The reservation's lock stays held until its entry is committed."""


class PublishNew(_LocalTarget):
    """Link a file no manifest lists (an average, an export) under a new name, refusing
    (never replacing) a file another process published first. Its ``.tmp`` is the name's
    claim: opened without following a link, ``flock``-ed, checked to be the file at that
    name, and unlinked before its lock is dropped, so a second writer can never truncate a
    published file. ``total`` is the bytes the file will take (checked free first)."""

    def __init__(self, path: Path, total: int) -> None:
        super().__init__(path)
        self.total = total

    def _open(self) -> int:
        if os.path.lexists(self.path):
            raise _exists(self.path)
        safeio.require_room(self.path, self.total)
        fd = safeio.open_nofollow(self.tmp, os.O_RDWR | os.O_CREAT)
        try:
            self._claim(fd)
            os.ftruncate(fd, 0)  # a leftover of a killed writer of this name is reused
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _claim(self, fd: int) -> None:
        """Lock the open ``.tmp``, or refuse when another writer holds or held it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(self.path) from None
        held = os.fstat(fd)
        try:
            at_name = os.lstat(self.tmp)
            current = (at_name.st_dev, at_name.st_ino) == (held.st_dev, held.st_ino)
        except FileNotFoundError:
            current = False
        if not current:  # a writer finished (and unlinked it) or another claimed a new one
            raise _exists(self.path) if os.path.lexists(self.path) else _busy(self.path)
        if held.st_nlink > 1:  # published by a writer killed before it removed its .tmp
            deleter.remove(self.tmp)
            raise _exists(self.path)

    def _publish(self) -> None:
        os.link(self.tmp, self.path)  # unlike a rename, fails when the name exists

    def _failed(self, exc: BaseException) -> BaseException:
        if isinstance(exc, FileExistsError):
            return ConfigError(
                f"{str(self.path)!r} was created by another process while this one was writing "
                "it; Nitro never overwrites a record, so this result was not saved. Choose a "
                "new name, or delete the other file first."
            )
        if _full(exc):
            return safeio.no_room(self.path, self.total, safeio.free_bytes(self.path.parent))
        return exc

    def _settle(self, fd: int) -> None:
        deleter.remove(self.tmp)  # before the lock drops: see the class docstring


class PublishDirectory(_LocalTarget):
    """Rename a record directory into place: other processes wrote (and fsynced) their files
    into ``tmp``; the commit writes its ``last`` file (``header.json``), fsyncs the
    directory's entries, renames it to :attr:`path`. Nothing is removed when it fails: the
    next write under the name clears the ``.tmp`` directory, which no reader loads.

    ``new=True`` (an ``export_hf`` directory): the name must not exist. It is checked before
    the rename, and the rename itself fails over a directory that holds anything, so of two
    writers of one name only the first publishes; the caller removes its ``tmp``."""

    def __init__(self, path: Path, tmp: Path, last: str, new: bool = False) -> None:
        super().__init__(path, tmp)
        self.last = last
        self.new = new

    def _open(self) -> int:
        return safeio.open_nofollow(self.tmp / self.last, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)

    def _ready(self) -> None:
        safeio.fsync_dir(self.tmp)  # its entries are durable before it is renamed

    def _publish(self) -> None:
        if self.new and os.path.lexists(self.path):
            raise _exists(self.path)
        try:
            os.rename(self.tmp, self.path)
        except OSError:  # ENOTEMPTY or EEXIST: another writer published it first
            if self.new and os.path.isdir(self.path):
                raise _exists(self.path) from None
            raise


def _full(exc: BaseException) -> bool:
    """A full disk met while writing (a :class:`DiskFull` a check raised is kept as it is)."""
    return safeio.is_disk_full(exc) and not isinstance(exc, DiskFull)


def _kept_as_it_was(path: Path) -> Callable[[int], DiskFull]:
    return lambda free: DiskFull(
        f"No room left in {str(path.parent)!r} to write {path.name!r} ({free} bytes free): "
        f"{path.name!r} was kept as it was, and the temporary file removed. Free space on that "
        "disk and try again."
    )


def _exists(path: Path) -> ConfigError:
    return ConfigError(
        f"{str(path)!r} already exists; Nitro never overwrites a record. Choose a new name, or "
        "delete the old file first."
    )


def _busy(path: Path) -> ConfigError:
    return ConfigError(
        f"{str(path)!r} is being written by another process right now; Nitro never overwrites "
        "a record, so this one was not saved. Choose a new name, or wait for that process."
    )
