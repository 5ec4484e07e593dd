"""A record outside the manifest (``average_checkpoints(save=...)``, ``export_weights``) is
published under a new name atomically: the name is claimed by its flock-ed ``.tmp`` and
published with ``link``, which never replaces a file. Of two writers of one name, the
loser is refused and the file holds the winner's record."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from nitro_core import (
    Checkpointer,
    ConfigError,
    Last,
    Nitro,
    average_checkpoints,
)
from nitro_core.store import recordio as store
from nitro_core.store import writer

from ..tiny import Tiny

REPO = Path(__file__).resolve().parents[3]


class KeepThree(Tiny):
    def checkpointer(self):
        return Checkpointer(keep=Last(3))


@pytest.fixture
def run(tmp_path):
    d = tmp_path / "run"
    Nitro(KeepThree(max_epochs=3), run_dir=d).train().logger.close()
    return d


def exists_refusal(path: Path) -> str:
    return (
        f"save= {str(path)!r} already exists; Nitro never overwrites it. Choose a new name, or "
        "delete the old file first."
    )


def busy_refusal(path: Path) -> str:
    return (
        f"{str(path)!r} is being written by another process right now; Nitro never overwrites "
        "a record, so this one was not saved. Choose a new name, or wait for that process."
    )


def late_refusal(path: Path) -> str:
    return (
        f"{str(path)!r} was created by another process while this one was writing it; Nitro "
        "never overwrites a record, so this result was not saved. Choose a new name, or delete "
        "the other file first."
    )


def assert_holds(path: Path, expected: dict[str, torch.Tensor]) -> None:
    tensors, _ = store.read_record(path)
    for key, value in expected.items():
        assert torch.equal(tensors[f"params/{key}"], value), key


class PausedWriter:
    """Runs ``average_checkpoints(..., save=path)`` in a thread that stops once its first
    record bytes are being written, until :meth:`finish`."""

    def __init__(self, monkeypatch, run_dir: Path, source: str, path: Path) -> None:
        self.writing, self.go = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        real = writer.Layout.pieces
        owner = threading.current_thread

        def pieces(layout):
            if owner() is self.thread:  # the write, not the hashing thread
                self.writing.set()
                self.go.wait(30)
            yield from real(layout)

        monkeypatch.setattr(writer.Layout, "pieces", pieces)

        def target() -> None:
            try:
                average_checkpoints(run_dir, source, save=path)
            except BaseException as exc:  # handed to the test
                self.error = exc

        self.thread = threading.Thread(target=target)
        self.thread.start()
        assert self.writing.wait(30), "the writer never started writing"

    def finish(self) -> BaseException | None:
        self.go.set()
        self.thread.join(30)
        return self.error


def test_an_existing_save_path_is_refused_before_anything_is_averaged(tmp_path):
    save = tmp_path / "avg.safetensors"
    save.write_bytes(b"someone's file")
    with pytest.raises(ConfigError) as exc:  # the run directory is empty: nothing to average
        average_checkpoints(tmp_path / "empty", "latest => Average(Last(2))", save=save)
    assert str(exc.value) == exists_refusal(save)
    assert save.read_bytes() == b"someone's file"


def test_a_save_name_another_writer_holds_is_refused_and_keeps_the_winners_average(
    run, monkeypatch
):
    save = run / "avg.safetensors"
    winner = average_checkpoints(run, "latest => Average(Last(3))")
    paused = PausedWriter(monkeypatch, run, "latest => Average(Last(3))", save)
    try:
        with pytest.raises(ConfigError) as exc:
            average_checkpoints(run, "latest => Average(Last(2))", save=save)
        assert str(exc.value) == busy_refusal(save)
    finally:
        assert paused.finish() is None
    assert_holds(save, winner.state)
    assert not store.tmp_path(save).exists()


def test_a_name_published_while_this_writer_wrote_is_refused_not_replaced(run, monkeypatch):
    save = run / "avg.safetensors"
    paused = PausedWriter(monkeypatch, run, "latest => Average(Last(3))", save)
    save.write_bytes(b"the other writer's record")  # published meanwhile, by another name's route
    error = paused.finish()
    assert isinstance(error, ConfigError) and str(error) == late_refusal(save)
    assert save.read_bytes() == b"the other writer's record"
    assert not store.tmp_path(save).exists()


def test_a_leftover_tmp_of_a_killed_writer_does_not_block_the_name(run):
    save = run / "avg.safetensors"
    store.tmp_path(save).write_bytes(b"half an average")  # its writer is gone: no lock held
    result = average_checkpoints(run, "latest => Average(Last(2))", save=save)
    assert_holds(save, result.state)
    assert not store.tmp_path(save).exists()


_RACER = """
import sys
from pathlib import Path
import time
from nitro_core import NitroError, average_checkpoints
run, source, save, go = sys.argv[1:]
while not Path(go).exists():
    time.sleep(0.001)
try:
    average_checkpoints(run, source, save=save)
    print("saved")
except NitroError as exc:
    print("refused:", exc)
"""


@pytest.mark.slow
def test_two_processes_saving_one_name_one_wins_and_the_file_holds_its_average(run):
    save, go = run / "avg.safetensors", run.parent / "go"
    sources = ["latest => Average(Last(3))", "latest => Average(Last(2))"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(run), source, str(save), str(go)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for source in sources
    ]
    go.touch()
    outs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert sorted(o == "saved" for o in outs) == [False, True], outs
    (loser,) = (o for o in outs if o != "saved")
    published = (
        f"{str(save)!r} already exists; Nitro never overwrites a record. Choose a new name, or "
        "delete the old file first."
    )  # the loser finished averaging after the winner published
    refusals = [exists_refusal(save), busy_refusal(save), late_refusal(save), published]
    assert loser in [f"refused: {m}" for m in refusals], loser
    winner = sources[outs.index("saved")]
    assert_holds(save, average_checkpoints(run, winner).state)
