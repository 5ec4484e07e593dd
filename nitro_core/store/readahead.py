"""Read-ahead off the reader's thread: the disk reads the next bytes of a record while the
reader hashes and its caller computes on the bytes it already has (``RecordFile.read``,
which reads through a mapping; a stream's ``preadv`` calls get the kernel's own
read-ahead).

``posix_fadvise(POSIX_FADV_WILLNEED)`` (and ``madvise(MADV_WILLNEED)``) starts the kernel
reading a range into the page cache, but the call itself allocates the pages and submits
the reads, and blocks once the device's queue is full: issued on the reader's thread, a
window wide enough to keep the disk busy stalls the reader for as long as the disk takes.
:func:`request` hands the range to one daemon thread shared by every reader in the process,
which advises the pending ranges 1 MiB at a time, in turns; the caller returns at once. Readers bound
how far ahead they ask (:data:`nitro_core.store.reader` keeps a window per record), so the
queue stays a few requests long.

A request is a hint. Advising a descriptor that its reader has closed since (or that the
process reused for another file) fails or warms the wrong pages, and nothing reads wrong
bytes either way: readers read through their own mapping, never through this thread.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque

_PIECE = 1024 * 1024  # bytes advised per call; pending requests take turns piece by piece

_lock = threading.Lock()
_requests: queue.SimpleQueue[tuple[int, int, int]] = queue.SimpleQueue()
_thread: threading.Thread | None = None

AVAILABLE = hasattr(os, "posix_fadvise")


def request(fd: int, offset: int, length: int) -> None:
    """Ask for ``length`` bytes of ``fd`` from ``offset`` to be read into the page cache, in
    the background (returns at once; no-op where ``posix_fadvise`` is missing)."""
    global _thread
    if not AVAILABLE or length <= 0:
        return
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_serve, name="nitro-readahead", daemon=True)
            _thread.start()
    _requests.put((fd, offset, offset + length))


def _serve() -> None:
    pending: deque[tuple[int, int, int]] = deque()
    while True:
        if not pending:
            pending.append(_requests.get())
        while not _requests.empty():
            pending.append(_requests.get_nowait())
        fd, start, stop = next_piece(pending)
        try:
            os.posix_fadvise(fd, start, stop - start, os.POSIX_FADV_WILLNEED)
        except OSError:  # closed since: its reader no longer wants it
            pending = deque(p for p in pending if p[0] != fd)


def next_piece(pending: deque[tuple[int, int, int]]) -> tuple[int, int, int]:
    """The next ``(fd, start, stop)`` to advise, taken from the first pending range, whose
    rest goes to the back of the line: readers reading at the same time get their next
    bytes in turns, none waiting behind another's whole window."""
    fd, start, end = pending.popleft()
    stop = min(start + _PIECE, end)
    if stop < end:
        pending.append((fd, stop, end))
    return fd, start, stop
