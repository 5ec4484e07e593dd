"""Opening the files Nitro keeps in a run directory without following a link out of it;
inter-process lock files; the free-space figures a commit checks first.

A run directory may itself be a symbolic link (the user's choice), but Nitro follows no
link inside it: the final component of every file it creates or reads there (a record's
``.tmp``, ``manifest.json`` and its ``.tmp``, lock files, logs) is opened with
``O_NOFOLLOW``, and a subdirectory it writes into (``logs/``) must resolve inside the run
directory. Either refusal is an :class:`UnsafePath` naming the path and what to do.
Nothing here reads file contents into an error message.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import shlex
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from nitro_core.errors import DiskFull, NotWritable, RecordError, UnsafePath

_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)  # the system refuses the write
_WRITES = os.O_CREAT | os.O_WRONLY | os.O_RDWR


RUN_DIR = "a run directory"
_ELSEWHERE = {RUN_DIR: "choose another run_dir"}  # what else to do, by where the write is

# The most Nitro reads of each file it parses whole (DESIGN section 16): the size is checked
# before a byte is read (fstat on disk, the object's length on S3), so a planted or damaged
# file costs a refusal, never the memory to hold it. Each is far above what Nitro writes.
MiB = 1024 * 1024
READ_LIMITS = {
    "manifest": 128 * MiB,  # ~300k entries; a 100k-entry manifest is ~40 MiB
    "journal": 512 * MiB,  # the manifest's appended changes between two compactions
    "record header": 100 * MiB,  # as record_header.MAX_HEADER, for a record directory's JSON
    "safetensors index": 64 * MiB,  # a Hugging Face directory's weight map
    "provenance file": 16 * MiB,
    "job file": 16 * MiB,  # a job's spec.json or status.json
    "job index": 256 * MiB,  # the job store's index, read from where it was last read
    "claim": 1 * MiB,  # an object store's claim object
}


def too_large(what: str, shown: str, size: int) -> RecordError:
    """The refusal of a ``what`` (a key of :data:`READ_LIMITS`) of ``size`` bytes."""
    limit = READ_LIMITS[what]
    return RecordError(
        f"Refusing to read the {what} {shown!r}: it is {size} bytes, over the {limit} bytes "
        f"({limit // MiB} MiB) Nitro reads of a {what}, far more than Nitro ever writes, so "
        "it was not written by Nitro or is damaged. Move it aside (or restore it from a "
        "backup) and call again."
    )


def read_capped(f: BinaryIO, what: str, shown: str, size: int | None = None) -> bytes:
    """The rest of the open file ``f``, refused (:func:`too_large`) when longer than the
    limit for ``what``: by its size before reading (``size``, else fstat from the current
    position), then by what a read returns (a file that grows meanwhile)."""
    limit = READ_LIMITS[what]
    if size is None:
        size = os.fstat(f.fileno()).st_size - f.tell()
    if size > limit:
        raise too_large(what, shown, size)
    data = f.read(limit + 1)
    if len(data) > limit:
        raise too_large(what, shown, len(data))
    return data


def link_refusal(path: Path, where: str = RUN_DIR) -> UnsafePath:
    """The refusal of ``path``, a link found where Nitro keeps its files (``where``: a run
    directory, or its job store)."""
    return UnsafePath(
        f"Refusing to open {str(path)!r}: it is a symbolic link, and Nitro never follows a link "
        f"for a file it keeps in {where} (it could lead outside it). Replace the link by "
        "the real file, or remove it."
    )


def open_nofollow(path: Path, flags: int, mode: int = 0o644, where: str = RUN_DIR) -> int:
    """``os.open`` that refuses (:class:`UnsafePath`) when the last component is a link."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise link_refusal(Path(path), where) from None
        raise


def confined_dir(base: Path, sub: Path) -> Path:
    """Create ``sub`` (a directory below ``base``) when missing; refuse one that is a link
    leading outside ``base`` (compared as resolved paths, never as string prefixes)."""
    base, sub = Path(base), Path(sub)
    if not os.path.lexists(sub):
        sub.mkdir(parents=True, exist_ok=True)
    real = sub.resolve()
    if not real.is_relative_to(base.resolve()) or not real.is_dir():
        raise UnsafePath(
            f"Refusing to write into {str(sub)!r}: it is a link that leads outside the run "
            f"directory {str(base)!r}, and Nitro writes only inside it. Replace the link by a "
            "real directory, or remove it."
        )
    return sub


# Lock fds this process holds. An flock belongs to the open file, which a forked child (a
# DataLoader worker started while a run trains) shares: its copies would keep the run's
# locks held after this process died. A child closes them at once (os.register_at_fork),
# which leaves this process's locks as they are. Process-wide by nature, hence module state.
# A lock fd is opened and noted under _OPENING, which a fork waits for: a child forked from
# another thread in between would keep an fd it does not know to close (a probe's lock, held
# for an instant, then held by the child for its life: the next locker waits forever).
_LOCK_FDS: set[int] = set()
_OPENING = threading.Lock()


@functools.cache
def _close_locks_in_children() -> None:
    os.register_at_fork(
        before=_OPENING.acquire, after_in_parent=_OPENING.release, after_in_child=_in_child
    )


def _in_child() -> None:
    _OPENING.release()  # held by the thread that forked, the child's only one
    for fd in list(_LOCK_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _LOCK_FDS.clear()


def keep_lock_from_children(fd: int) -> None:
    """Have forked children close ``fd``, a lock this process holds, as they start."""
    _close_locks_in_children()
    _LOCK_FDS.add(fd)


def open_lock(path: Path, flags: int, where: str = RUN_DIR) -> int:
    """Open ``path`` (never through a link) as a lock fd that forked children close as they
    start, with no instant in which a fork could copy it unnoted; close it with
    :func:`close_lock`. Creating or writing it where the system refuses is
    :class:`NotWritable`."""
    _close_locks_in_children()
    try:
        with _OPENING:
            fd = open_nofollow(path, flags, where=where)
            _LOCK_FDS.add(fd)
    except OSError as exc:
        if flags & _WRITES and exc.errno in _DENIED:
            raise not_writable(Path(path).parent, Path(path).name, exc.errno, where) from None
        raise
    return fd


def make_dir(directory: Path, where: str = RUN_DIR) -> None:
    """Create ``directory`` and its missing parents (present already is fine); where the
    system refuses, :class:`NotWritable` names the directory it could not write in."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno not in _DENIED:
            raise
        failed = Path(exc.filename) if exc.filename else directory
        raise not_writable(failed.parent, failed.name, exc.errno, where) from None


def check_writable(directory: Path, where: str = RUN_DIR) -> None:
    """Refuse (:class:`NotWritable`) a directory this process could neither create nor write
    in, before anything starts that would (:func:`make_dir`, then its lock files): asked of
    the permissions of it, or of its nearest existing parent (``os.access``)."""
    target = Path(os.path.abspath(directory))
    existing = target
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if os.access(existing, os.W_OK | os.X_OK):
        return
    below = [p for p in (target, *target.parents) if p.parent == existing]  # what it creates
    raise not_writable(existing, below[0].name if below else None, errno.EACCES, where)


def not_writable(
    directory: Path, name: str | None, code: int | None, where: str = RUN_DIR
) -> NotWritable:
    """The refusal of writing in ``directory`` (creating ``name`` there, when known) for
    ``where``, which the system denied with the error number ``code``; and what to do."""
    fix = _ELSEWHERE.get(where, "choose another directory")
    why = f"Nitro creates {name!r} there" if name else f"Nitro keeps the files of {where} there"
    if code == errno.EROFS:
        return NotWritable(
            f"Cannot write in {str(directory)!r}: it is on a read-only file system ({why}). "
            f"Mount it read-write, or {fix}."
        )
    return NotWritable(
        f"Cannot write in {str(directory)!r}: permission denied ({why}). Make it writable "
        f"(chmod u+w {shlex.quote(str(directory))}), or {fix}."
    )


def close_lock(fd: int) -> None:
    """Close a lock fd (dropping its lock)."""
    _LOCK_FDS.discard(fd)
    os.close(fd)


@contextmanager
def flocked(path: Path, blocking: bool = True, where: str = RUN_DIR) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on the lock file ``path`` (created, never truncated, never
    followed through a link) for the block. Yields False, holding nothing, when
    ``blocking`` is False and another open file holds it."""
    fd = open_lock(path, os.O_CREAT | os.O_RDWR, where=where)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        close_lock(fd)  # also drops the lock


def lock_held(path: Path, where: str = RUN_DIR) -> bool:
    """Whether another open file holds the ``flock`` of the lock file ``path``, probed
    without creating it (a missing file holds none) and never through a link (refused as
    :class:`UnsafePath`). The one probe of a lock: a run's training lock, a record's
    write claim."""
    try:
        fd = open_lock(path, os.O_RDONLY | os.O_NONBLOCK, where=where)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        close_lock(fd)  # also drops the probe's lock
    return False


def fsync_dir(directory: Path) -> None:
    """Make a rename (or link, or unlink) in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on ``directory``'s file system."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _FULL


def require_room(path: Path, needed: int, detail: str = "") -> None:
    """Refuse (:class:`DiskFull`) to write ``path`` when its directory has under ``needed``
    bytes free; ``detail`` says what the bytes are for."""
    free = free_bytes(path.parent)
    if free < needed:
        raise no_room(path, needed, free, detail)


def no_room(path: Path, needed: int, free: int, detail: str = "") -> DiskFull:
    """The error for a write of ``path`` that needs ``needed`` bytes with ``free`` left; the
    caller removes the partial file before it raises this."""
    return DiskFull(
        f"No room left in {str(path.parent)!r} to commit {path.name!r}: it needs {needed} "
        f"bytes{detail}, {free} are free. Nothing was committed: every file that was there (the "
        "manifest and each record it lists) is as it was, and the partial file was removed. "
        "Free space on that disk and write again (a training run resumes with resume='auto')."
    )
