"""Claiming names in a run directory: a record's reservation, the leftovers of killed
writes (set aside, then reclaimed once their writer is provably dead), publishing a record
under a new name without ever replacing a file, and the lock files.

A claim is an ``flock`` on the ``.tmp`` of the name, taken when the file is created; the
lock follows the inode through a rename, so "no process holds its lock" proves the writer
that made a leftover is gone. Every file here is opened without following a link.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nitro_core.errors import ConfigError
from nitro_core.store import deleter, safeio
from nitro_core.store.safeio import (
    close_lock,
    flocked,
    fsync_dir,
    is_disk_full,
    keep_lock_from_children,
    no_room,
    open_nofollow,
    require_room,
)

TMP_SUFFIX = ".tmp"
LOCK_NAME = ".manifest.lock"
_STALE = re.compile(r"\.safetensors(\.tmp)?\.stale\d*$")


def tmp_path(path: Path) -> Path:
    return path.with_name(path.name + TMP_SUFFIX)


def remove_file(path: Path) -> None:
    """Delete a record the manifest no longer lists, or a leftover (already gone is fine); a
    record directory (several processes wrote it) goes with its files. Through the one
    deleter, :func:`nitro_core.store.deleter.remove`: no link is followed."""
    deleter.remove(path)


# -- reserving a record's name ---------------------------------------------------------------
@dataclass
class Reservation:
    """A record name claimed by this process: its ``.tmp`` is created and flock-ed, and the
    lock follows the inode through the rename until :meth:`release`, so another writer can
    tell a file in flight from one left by a killed process."""

    path: Path
    fd: int
    set_aside: list[Path]
    reclaimed: list[tuple[str, int]] = field(default_factory=list)  # (name, bytes) removed

    def release(self) -> None:
        if self.fd >= 0:
            close_lock(self.fd)  # closing drops the flock
            self.fd = -1


def reserve(path: Path) -> Reservation | None:
    """Claim ``path`` for a new record, or None when another live process is writing it.

    A ``.tmp`` or an unlisted final file that no live process holds is a leftover of an
    interrupted write: it is moved aside (``.stale``) rather than overwritten, and the
    ``.stale`` files set aside by earlier writes whose writers are provably dead (no process
    holds their lock) are removed. Call with the manifest lock held, after checking the
    manifest does not list ``path``.
    """
    leftovers = [p for p in (tmp_path(path), path) if os.path.lexists(p)]
    if any(in_flight(p) for p in leftovers):
        return None
    reclaimed = reclaim_stale(path.parent)
    moved = [set_aside(p, ".stale") for p in leftovers]
    fd = open_nofollow(tmp_path(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    keep_lock_from_children(fd)
    fcntl.flock(fd, fcntl.LOCK_EX)  # blocking: only an in_flight() probe can hold it, briefly
    return Reservation(path=path, fd=fd, set_aside=moved, reclaimed=reclaimed)


def in_flight(path: Path) -> bool:
    """Whether a live process holds the write lock of ``path`` (a link holds none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return False
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the probe's lock
    return False


def set_aside(path: Path, suffix: str) -> Path:
    """Rename an unlisted file out of the way of a write; returns its new path."""
    target = path.with_name(path.name + suffix)
    n = 1
    while os.path.lexists(target):
        n += 1
        target = path.with_name(f"{path.name}{suffix}{n}")
    os.replace(path, target)
    fsync_dir(path.parent)
    return target


def reclaim_stale(directory: Path) -> list[tuple[str, int]]:
    """Remove the ``.stale`` leftovers in ``directory`` whose writer is provably dead: the
    write lock that follows their inode is free. One a live process holds is kept.
    Returns ``(name, bytes)`` per file removed."""
    removed = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    for name in names:
        path = Path(directory) / name
        if not _STALE.search(name) or in_flight(path):
            continue
        gone = deleter.remove(path)
        if gone.kind == "missing":
            continue  # another writer reclaimed it first
        removed.append((name, gone.bytes))
    if removed:
        fsync_dir(Path(directory))
    return removed


def describe_reclaimed(directory: Path, reclaimed: list[tuple[str, int]]) -> str:
    """The warning that says which leftovers were removed and how many bytes came back."""
    names = ", ".join(repr(n) for n, _ in reclaimed[:3])
    if len(reclaimed) > 3:
        names += f" and {len(reclaimed) - 3} more"
    return (
        f"Reclaimed {sum(b for _, b in reclaimed)} bytes in {str(directory)!r}: removed "
        f"{len(reclaimed)} leftover file(s) of interrupted writes ({names}), which no manifest "
        "lists and no live process holds."
    )


# -- publishing outside a manifest ---------------------------------------------------------
def publish_new(path: Path, write: Callable[[Any], Any], total: int) -> str:
    """Write a record that no manifest lists under a new name, refusing (never replacing) a
    file another process published first. Its ``.tmp`` is the name's reservation: opened
    without following a link, flock-ed, checked to be the file at that name, and unlinked
    before its lock is dropped, so a second writer can never truncate a published file."""
    if os.path.lexists(path):
        raise _exists(path)
    require_room(path, total)
    tmp = tmp_path(path)
    fd = open_nofollow(tmp, os.O_RDWR | os.O_CREAT)
    try:
        _claim(fd, tmp, path)
        os.ftruncate(fd, 0)  # a leftover of a killed writer of this name is reused
        try:
            with os.fdopen(os.dup(fd), "wb") as f:
                file_hash = write(f)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)  # unlike a rename, fails when the name exists
        except FileExistsError:
            raise ConfigError(
                f"{str(path)!r} was created by another process while this one was writing it; "
                "Nitro never overwrites a record, so this result was not saved. Choose a new "
                "name, or delete the other file first."
            ) from None
        except OSError as exc:
            if is_disk_full(exc):
                raise no_room(path, total, safeio.free_bytes(path.parent)) from None
            raise
        finally:
            remove_file(tmp)  # before the lock drops: see above
        fsync_dir(path.parent)
        return file_hash()
    finally:
        os.close(fd)


def _claim(fd: int, tmp: Path, path: Path) -> None:
    """Lock the open ``.tmp`` of ``path``, or refuse when another writer holds or held it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _busy(path) from None
    held = os.fstat(fd)
    try:
        at_name = os.lstat(tmp)
        current = (at_name.st_dev, at_name.st_ino) == (held.st_dev, held.st_ino)
    except FileNotFoundError:
        current = False
    if not current:  # a writer finished (and unlinked it) or another claimed a new one
        raise _exists(path) if os.path.lexists(path) else _busy(path)
    if held.st_nlink > 1:  # published by a writer killed before it removed its .tmp
        remove_file(tmp)
        raise _exists(path)


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


# -- lock files -----------------------------------------------------------------------------
@contextmanager
def manifest_lock(directory: Path) -> Iterator[None]:
    """Hold the directory's inter-process manifest lock."""
    directory.mkdir(parents=True, exist_ok=True)
    with flocked(directory / LOCK_NAME):
        yield


def run_lock_path(directory: Path, run: str) -> Path:
    """The run's training lock file, ``.run-<id>.lock``."""
    return directory / f".run-{run}.lock"


@contextmanager
def run_lock(directory: Path, run: str) -> Iterator[bool]:
    """Hold the run's training lock (``.run-<id>.lock``) for the block; yields False, holding
    nothing, when another live process holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    with flocked(run_lock_path(directory, run), blocking=False) as mine:
        yield mine


def refuse_existing(path: Path, what: str) -> None:
    if path.suffix != ".safetensors":
        raise ConfigError(
            f"{what} {str(path)!r} must name a .safetensors file (sources find records by that "
            "suffix), e.g. 'runs/my_run/avg10.safetensors'."
        )
    if path.exists():
        raise ConfigError(
            f"{what} {str(path)!r} already exists; Nitro never overwrites it. Choose a new name, "
            "or delete the old file first."
        )
