"""The manifest journal against processes: two processes appending to one run directory while a
third reads it, and a SIGKILL at every step of every kind of manifest write (an append, a
compaction, a journal's start, the end of a run, a small manifest's rewrite). After each kill
the manifest as read is the one before the write or the one after it, never older, and the
next write succeeds.

The processes are forked from this one (tests/nitro_core/_journal_procs.py), so each starts
at once; a child counts the calls a write makes and SIGKILLs itself at the one it was told."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nitro_core.store import journal, manifest
from tests.nitro_core.store.test_journal import build, change, document, files, fresh, lines

from .._journal_procs import Child, entry

BOUND_S = 120  # generous: a loaded machine is slow, never wrong


def test_two_processes_appending_to_one_directory_lose_and_repeat_nothing(tmp_path):
    """Two writers (each compacting at its end, as a run does) and a reader in a third
    process: every manifest the reader sees, fresh or from its cache, is a prefix of the
    final one (never a change lost, repeated or taken back), and the final one holds both."""
    d = tmp_path
    build(d, 20)  # small enough that the journal is folded in every few changes
    writers = [
        Child({"op": "writer", "dir": str(d), "start": 100, "count": 40, "compact_every": 13}),
        Child({"op": "writer", "dir": str(d), "start": 200, "count": 40, "compact_every": 17}),
    ]
    seen: list[list[str]] = []
    deadline = time.monotonic() + BOUND_S
    while not all(w.poll() for w in writers):
        assert time.monotonic() < deadline, "the writers did not end"
        if len(seen) % 2:
            manifest._SEEN.clear()  # a fresh reader; otherwise the cached one reads what is new
        seen.append([e.file for e in manifest.read_manifest(d)])
    assert [w.wait()["exit"] for w in writers] == [0, 0]
    final = fresh(d)
    assert sorted(final) == sorted(files(*range(1, 21), *range(100, 140), *range(200, 240)))
    assert [f for f in final if f in files(*range(100, 140))] == files(*range(100, 140))
    assert [f for f in final if f in files(*range(200, 240))] == files(*range(200, 240))
    assert len(seen) > 10 and len({len(s) for s in seen}) > 5  # it read while they wrote
    for listed in seen:
        assert final[: len(listed)] == listed


def _complete(d: Path) -> None:
    build(d, 20)


def _journaled(d: Path) -> None:
    build(d, 19)
    change(d, add=20)  # starts the journal
    change(d, add=21, drop=1)


def _full(d: Path) -> None:
    """A journal past a quarter of manifest.json: the next change compacts."""
    _journaled(d)
    size = (d / "manifest.json").stat().st_size
    i = 21
    while (d / journal.NAME).stat().st_size <= size // 4:
        i += 1
        change(d, add=i, drop=i - 20)


def _added(before: list[str]) -> list[str]:
    return [f for f in before if f != entry(2).file] + [entry(300).file]


def _appended(d: Path) -> None:
    assert len(lines(d)) == 3 and "journal_id" in document(d)


def _emptied(d: Path) -> None:
    assert len(lines(d)) == 1 and json.loads(lines(d)[0][17:])["id"] == document(d)["journal_id"]


def _removed(d: Path) -> None:
    assert not (d / journal.NAME).exists() and "journal_id" not in document(d)


COMMIT = {"op": "commit", "add": [300], "drop": [2]}
Scenario = tuple[Callable[[Path], None], dict[str, Any], Callable, Callable[[Path], None]]
SCENARIOS: dict[str, Scenario] = {
    "append": (_journaled, COMMIT, _added, _appended),
    "compaction": (_full, COMMIT, _added, _emptied),
    "start": (_complete, COMMIT, _added, _emptied),
    "end-of-run": (_journaled, {"op": "compact"}, lambda before: before, _removed),
    "small-rewrite": (_journaled, {**COMMIT, "small": 10**9}, _added, _removed),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_a_sigkill_at_every_step_of_a_manifest_write_leaves_before_or_after(
    tmp_path, monkeypatch, name
):
    monkeypatch.setattr(manifest, "SMALL", 0)
    prepare, cmd, expected, finished = SCENARIOS[name]
    template = tmp_path / "template"
    template.mkdir()
    prepare(template)
    killed = 0
    for step in range(1, 100):
        d = tmp_path / f"kill-{step}"
        shutil.copytree(template, d)
        before = fresh(d)
        after = expected(before)
        reply = Child({**cmd, "dir": str(d), "kill": step}).wait(BOUND_S)
        got = fresh(d)  # refused, were a kill to leave a pair that does not match
        assert got in (before, after), (name, step, reply)
        if reply != {"signal": 9}:
            assert reply == {"exit": 0, "steps": step - 1} and got == after, (name, step, reply)
            finished(d)
        change(d, add=400)  # the next write succeeds, on what the kill left
        assert fresh(d) == got + [entry(400).file], (name, step)
        if reply != {"signal": 9}:
            break
        killed += 1
    else:
        pytest.fail(f"{name}: still killed at step 99")
    assert killed >= 4, (name, killed)  # it had steps to be killed at
