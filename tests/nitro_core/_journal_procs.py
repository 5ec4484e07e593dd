"""Child processes for test_journal_processes.py: each forked from the test process (so it
starts at once, its imports done) and SIGKILLed, when told, at an exact step of a manifest
write.

A command is a dict:

- ``{"op": "commit", "dir": D, "add": [i...], "drop": [i...], "small": S, "kill": K}``: under
  the manifest lock, commit the entries ``entry(i)`` and drop ``entry(j).file``, with
  ``manifest.SMALL = S``;
- ``{"op": "compact", "dir": D, "kill": K}``: ``manifest.compact(D)`` (the end of a run);
- ``{"op": "writer", "dir": D, "start": i, "count": n, "compact_every": k}``: commit
  ``entry(i)``, ``entry(i + 1)``, ... one change at a time (``SMALL = 0``, so each is a journal
  line, a compaction or a journal's start), and ``manifest.compact(D)`` after each ``i``
  divisible by ``k`` (as a run's end does).

``kill`` (optional) arms a step counter on the calls a write makes (``os.open`` for writing,
``os.pwrite`` (two steps: before it, and after half its bytes are written), ``os.ftruncate``,
``os.fsync``, ``os.replace``, ``os.unlink``): the child SIGKILLs itself at step ``kill``.
:meth:`Child.wait` gives ``{"signal": 9}`` for a killed child, ``{"exit": 0, "steps": N}`` for
one that ran to its end (N steps), or ``{"exit": 1}`` (its traceback on stderr).
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from pathlib import Path
from typing import Any

from nitro_core.store import manifest
from nitro_core.store import recordio as store


def entry(i: int, run: str = "abcd1234") -> manifest.ManifestEntry:
    return manifest.ManifestEntry(
        file=f"epoch-{i:04d}-step-{i}.safetensors", epoch=i, step=i, score=1.0 / (i + 1),
        metric="loss", mode="min", stop_reason=None, run=run,
        written="2026-01-01T00:00:00.000Z", bytes=i, digest=f"xxh3-128-tree:{i:032x}",
    )  # fmt: skip


def _arm(kill: int) -> list[int]:
    """Count the write steps this process makes; SIGKILL it at step ``kill``."""
    count = [0]

    def step() -> None:
        count[0] += 1
        if count[0] == kill:
            os.kill(os.getpid(), signal.SIGKILL)

    def wrapped(real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            step()
            return real(*args, **kwargs)

        return call

    for name in ("ftruncate", "fsync", "replace", "unlink"):
        setattr(os, name, wrapped(getattr(os, name)))
    real_open, real_pwrite = os.open, os.pwrite

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            step()
        return real_open(path, flags, *args, **kwargs)

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        step()
        if count[0] + 1 == kill:  # a torn append: half its bytes, then the kill
            real_pwrite(fd, data[: len(data) // 2], offset)
        step()
        return real_pwrite(fd, data, offset)

    os.open, os.pwrite = open_, pwrite  # type: ignore[assignment]
    return count


def _run(cmd: dict[str, Any]) -> int:
    d = Path(cmd["dir"])
    count = _arm(cmd["kill"]) if "kill" in cmd else [0]
    if cmd["op"] == "commit":
        manifest.SMALL = cmd.get("small", 0)
        with store.manifest_lock(d):
            manifest.commit(
                d, add=[entry(i) for i in cmd["add"]], drop=[entry(j).file for j in cmd["drop"]]
            )
    elif cmd["op"] == "compact":
        manifest.compact(d)
    elif cmd["op"] == "writer":
        manifest.SMALL = 0
        for i in range(cmd["start"], cmd["start"] + cmd["count"]):
            with store.manifest_lock(d):
                manifest.commit(d, add=[entry(i)])
            if i % cmd.get("compact_every", 10**9) == 0:  # as a run's end does
                manifest.compact(d)
    else:
        raise ValueError(f"unknown op {cmd['op']!r}")
    return count[0]


class Child:
    """One command, run in a forked child process."""

    def __init__(self, cmd: dict[str, Any]) -> None:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: it reads the directory afresh, as another process does
            os.close(r)
            try:
                manifest._SEEN.clear()
                steps = _run(cmd)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os.write(w, str(steps).encode())
            os._exit(0)
        os.close(w)
        self.pid, self._out, self.result = pid, r, None

    def poll(self) -> dict[str, Any] | None:
        """Its result once it ended, else None."""
        if self.result is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                with os.fdopen(self._out, "rb") as f:
                    out = f.read()
                if os.WIFSIGNALED(status):
                    self.result = {"signal": os.WTERMSIG(status)}
                elif (code := os.WEXITSTATUS(status)) == 0:
                    self.result = {"exit": 0, "steps": int(out)}
                else:
                    self.result = {"exit": code}
        return self.result

    def wait(self, bound_s: float = 120.0) -> dict[str, Any]:
        """Its result, waiting for its end (a generous bound: a loaded machine is slow)."""
        deadline = time.monotonic() + bound_s
        while (result := self.poll()) is None:
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                raise AssertionError(f"the child {self.pid} did not end within {bound_s} s")
            time.sleep(0.001)
        return result
