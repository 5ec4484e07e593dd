"""Claiming names in a run directory: a record's reservation, the leftovers of killed
writes (set aside, then reclaimed once their writer is provably dead), and the lock files.
Publishing under a new name, without ever replacing a file, is
:class:`nitro_core.store.atomic.PublishNew`'s.

A claim is an ``flock`` on the ``.tmp`` of the name, taken when the file is created; the
lock follows the inode through a rename, so "no process holds its lock" proves the writer
that made a leftover is gone. Every file here is opened without following a link.
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from nitro_core.errors import ConfigError, UnsafePath
from nitro_core.store import deleter
from nitro_core.store.atomic import tmp_path
from nitro_core.store.safeio import (
    check_writable,
    close_lock,
    flocked,
    fsync_dir,
    lock_held,
    make_dir,
    open_lock,
)

LOCK_NAME = ".manifest.lock"
_STALE = re.compile(r"\.safetensors(\.tmp)?\.stale\d*$")


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
    fd = open_lock(tmp_path(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # blocking: only an in_flight() probe can hold it, briefly
    return Reservation(path=path, fd=fd, set_aside=moved, reclaimed=reclaimed)


def in_flight(path: Path) -> bool:
    """Whether a live process holds the write lock of ``path`` (a link holds none)."""
    try:
        return lock_held(path)
    except UnsafePath:  # a link in a record's place: a leftover no writer holds
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


# -- lock files -----------------------------------------------------------------------------
@contextmanager
def manifest_lock(directory: Path) -> Iterator[None]:
    """Hold the directory's inter-process manifest lock."""
    make_dir(directory)
    with flocked(directory / LOCK_NAME):
        yield


def run_lock_path(directory: Path, run: str) -> Path:
    """The run's training lock file, ``.run-<id>.lock``."""
    return directory / f".run-{run}.lock"


@contextmanager
def run_lock(directory: Path, run: str) -> Iterator[bool]:
    """Hold the run's training lock (``.run-<id>.lock``) for the block; yields False, holding
    nothing, when another live process holds it. The run's first write: a directory that
    cannot be written is refused here (:class:`NotWritable`), before anything is trained,
    also when the lock files an earlier run left there still open."""
    make_dir(directory)
    check_writable(directory)
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
