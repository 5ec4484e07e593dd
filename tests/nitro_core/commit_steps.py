"""Recording the commit protocol's steps as they happen: every ``os.fsync`` (of which file
or directory, by the path its descriptor has at that moment) and every ``os.replace``,
``os.rename`` and ``os.link``, in order, with paths relative to a base directory."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

Step = tuple[str, ...]


def record(monkeypatch: pytest.MonkeyPatch, base: Path) -> list[Step]:
    """Patch the four calls for the test; returns the list the steps are appended to."""
    steps: list[Step] = []
    real = {name: getattr(os, name) for name in ("fsync", "replace", "rename", "link")}

    def name(path: str | os.PathLike[str]) -> str:
        inside = Path(path).is_relative_to(base)
        return str(Path(path).relative_to(base)) if inside else str(path)

    def fsync(fd: int) -> None:
        steps.append(("fsync", name(os.readlink(f"/proc/self/fd/{fd}"))))
        real["fsync"](fd)

    def moved(call: str) -> Callable[..., Any]:
        def move(src: str, dst: str, *args: Any, **kwargs: Any) -> Any:
            steps.append((call, name(src), name(dst)))
            return real[call](src, dst, *args, **kwargs)

        return move

    monkeypatch.setattr(os, "fsync", fsync)
    for call in ("replace", "rename", "link"):
        monkeypatch.setattr(os, call, moved(call))
    return steps
