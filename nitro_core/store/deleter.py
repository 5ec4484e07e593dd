"""The one deleter of records: whatever a name in a run directory holds (a record file, a
record directory of shards, a killed write's leftover), removed without following a link.

Retention (the writer's eviction, one process or several), ``delete_checkpoints`` and the
removal of leftovers all call :func:`remove`; :func:`survey` says first what a name holds
and how many bytes removing it frees, which is what a deletion reports (a dry run too).

- a regular file is unlinked;
- a directory (a record directory) goes with everything in it, removed by
  ``shutil.rmtree``'s file-descriptor walk, which never follows a link: a link inside it is
  unlinked as a link, its target untouched;
- a link at the name itself is unlinked, never followed: its target, inside or outside the
  run directory, is not touched, and its removal frees nothing (0 bytes);
- anything else (a FIFO, a socket) is left in place;
- a name already gone is fine.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["file", "directory", "link", "missing", "other"]


@dataclass(frozen=True)
class Found:
    """What a name holds, and the bytes its removal frees (a directory's regular files
    summed, links not followed)."""

    kind: Kind
    bytes: int


def survey(path: Path) -> Found:
    """What ``path`` holds, without following a link."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Found("missing", 0)
    if stat.S_ISLNK(st.st_mode):
        return Found("link", 0)
    if stat.S_ISREG(st.st_mode):
        return Found("file", st.st_size)
    if stat.S_ISDIR(st.st_mode):
        return Found("directory", _tree_bytes(path))
    return Found("other", 0)


def remove(path: Path) -> Found:
    """Remove what ``path`` holds (see the module docstring); returns what it was. The
    caller fsyncs the directory that held it."""
    found = survey(path)
    try:
        if found.kind == "directory":
            shutil.rmtree(path)  # by file descriptor: never through a link (Linux, macOS)
        elif found.kind in ("file", "link"):
            os.unlink(path)
    except FileNotFoundError:
        return Found("missing", 0)  # another process removed it first
    return found


def _tree_bytes(path: Path) -> int:
    total = 0
    try:
        with os.scandir(path) as it:
            for e in it:
                if e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
                elif e.is_dir(follow_symlinks=False):
                    total += _tree_bytes(Path(e.path))
    except FileNotFoundError:
        pass
    return total
