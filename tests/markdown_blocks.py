"""Fenced blocks of the README and the documentation pages, and how a marked one runs.

A block is marked by an HTML comment on the line before its fence (invisible once rendered):

- ``<!-- runnable -->`` before a ``bash`` or ``python`` block: it runs in a fresh temporary
  directory, a ``bash`` block under ``bash -euo pipefail`` with this interpreter's directory
  first on PATH (so ``nitro`` is the project's), a ``python`` block as a script run by this
  interpreter; it passes when it exits 0.
- ``<!-- runnable: slow -->``: the same, in the slow suite (``pytest -m slow``).
- ``<!-- file: NAME -->``: the block is the file NAME (``experiments.py``), written beside
  every runnable block of the same page, as a reader following the page has it.
- ``<!-- call: TOOL -->`` / ``<!-- reply: TOOL -->`` before a ``json`` block: an MCP tool's
  arguments / structured reply, checked against the tool's schemas under ``schemas/tools/``.

Unmarked blocks are prose; a ``json`` block must parse whether marked or not.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```$", re.M | re.S)
_MARK = re.compile(r"<!--\s*([a-z]+(?::\s*[\w./ -]+?)?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, text, mark (None when unmarked), line and section
    (the ``##`` heading above it)."""

    lang: str
    text: str
    mark: str | None
    line: int
    section: str

    @property
    def id(self) -> str:
        return f"{self.lang}-line-{self.line}"

    @property
    def runnable(self) -> bool:
        return self.mark in ("runnable", "runnable:slow")


def blocks(markdown: str) -> list[Block]:
    """Every fenced block of ``markdown``, in order."""
    found = []
    for match in _FENCE.finditer(markdown):
        before = markdown[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        headings = re.findall(r"^## (.+)$", markdown[: match.start()], re.M)
        found.append(
            Block(
                lang=match.group(1),
                text=match.group(2),
                mark=re.sub(r"\s+", "", mark.group(1)) if mark else None,
                line=markdown.count("\n", 0, match.start()) + 1,
                section=headings[-1] if headings else "",
            )
        )
    return found


def files_of(page: list[Block]) -> dict[str, str]:
    """The page's ``file:`` blocks: name -> text."""
    return {
        b.mark.removeprefix("file:"): b.text
        for b in page
        if b.mark is not None and b.mark.startswith("file:")
    }


def param(block: Block, *before: object, prefix: str = "") -> object:
    """A pytest parameter (``before`` values, then the block), in the slow suite when the
    block is marked so."""
    marks = [pytest.mark.slow] if block.mark == "runnable:slow" else []
    return pytest.param(*before, block, id=f"{prefix}{block.id}", marks=marks)


def run_block(block: Block, where: Path, files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run one block in ``where`` with the page's files beside it."""
    for name, text in files.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(text)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if block.lang == "python":
        (where / "block.py").write_text(block.text)
        cmd = [sys.executable, "block.py"]
    else:
        assert block.lang in ("bash", "sh"), f"line {block.line}: cannot run a {block.lang!r} block"
        cmd = ["bash", "-euo", "pipefail", "-c", block.text]
    return subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True, timeout=600)


def failure(page: str, block: Block, done: subprocess.CompletedProcess[str]) -> str:
    return (
        f"{page} line {block.line} ({block.section}) exited {done.returncode}:\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
