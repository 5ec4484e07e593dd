"""Leftovers of interrupted writes (``.stale`` files set aside by a later write) are
reclaimed once their writer is provably dead (no process holds the lock that follows their
inode), with a warning saying how many bytes came back; a file a live process holds stays.
The real-kill version of this test is in test_reliability.py."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from nitro_core import Nitro, NitroWarning, read_manifest
from nitro_core.store import recordio as store

from ..tiny import KeepLast, NoVal

_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # holds the lock until the test closes stdin
"""


def train(run: Path, epochs: int, experiment: type = KeepLast) -> list[str]:
    """Train to ``epochs``; returns the texts of the NitroWarnings raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        n = Nitro(experiment(max_epochs=epochs), run_dir=run, resume="auto")
        n.train().logger.close()
    return [str(w.message) for w in caught if issubclass(w.category, NitroWarning)]


@pytest.fixture
def holder():
    """Start a process that flocks a file, as a live writer holds its record."""
    procs = []

    def hold(path: Path) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield hold
    for proc in procs:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_stale_files_of_dead_writers_are_reclaimed_and_a_live_ones_survives(tmp_path, holder):
    run = tmp_path / "run"
    train(run, 1)
    dead_tmp = run / "epoch-0009-step-36-loss=1.safetensors.tmp.stale"
    dead_final = run / "epoch-0008-step-32.safetensors.stale2"
    live = run / "epoch-0007-step-28.safetensors.tmp.stale"
    other = run / "notes.stale"  # not a record's leftover: never touched
    dead_tmp.write_bytes(b"x" * 1000)
    dead_final.write_bytes(b"y" * 500)
    live.write_bytes(b"z" * 300)
    other.write_bytes(b"mine")
    proc = holder(live)

    messages = train(run, 2)
    assert (
        f"Reclaimed 1500 bytes in {str(run)!r}: removed 2 leftover file(s) of interrupted writes "
        f"({dead_final.name!r}, {dead_tmp.name!r}), which no manifest lists and no live "
        "process holds."
    ) in messages, messages
    assert not dead_tmp.exists() and not dead_final.exists()
    assert live.read_bytes() == b"z" * 300 and other.read_bytes() == b"mine"

    proc.stdin.close()  # the live writer ends: its file is a leftover now
    proc.wait(timeout=30)
    messages = train(run, 3)
    assert (
        f"Reclaimed 300 bytes in {str(run)!r}: removed 1 leftover file(s) of interrupted writes "
        f"({live.name!r}), which no manifest lists and no live process holds."
    ) in messages, messages
    assert not live.exists() and [e.epoch for e in read_manifest(run)] == [2, 3]


def test_a_leftover_in_the_way_is_set_aside_first_and_reclaimed_by_the_next_write(tmp_path):
    run = tmp_path / "run"
    train(run, 1, NoVal)
    partial = run / "epoch-0002-step-8.safetensors.tmp"  # unscored: a name known in advance
    partial.write_bytes(b"half a record")
    train(run, 2, NoVal)  # epoch 2's write lands on it: set aside, as the warning says
    stale = run / "epoch-0002-step-8.safetensors.tmp.stale"
    assert stale.read_bytes() == b"half a record"
    messages = train(run, 3, NoVal)
    assert any(m.startswith("Reclaimed 13 bytes in ") for m in messages), messages
    assert not stale.exists()
    assert sorted(p.name for p in run.iterdir() if ".stale" in p.name) == []


def test_reclaim_skips_a_file_whose_lock_is_held(tmp_path, holder):
    live = tmp_path / "a.safetensors.stale"
    live.write_bytes(b"held")
    holder(live)
    assert store.reclaim_stale(tmp_path) == [] and live.exists()
