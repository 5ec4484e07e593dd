"""What a run shows on stderr while it trains (training/progress.py): a tqdm bar with rate
and ETAs on a terminal, a plain line every 30 s and at each epoch's end elsewhere, nothing
on stdout; and what Ctrl+C says (training/setup.py's handler), with a real SIGINT sent to a
process training a Regression."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import queue
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import warnings
from pathlib import Path

import pytest

from nitro_core import Nitro
from nitro_core.examples import Regression
from nitro_core.training import progress as progress_module
from nitro_core.training.progress import STOPPING, Progress

REPO = Path(__file__).resolve().parents[3]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _two_epochs(bar: Progress, clock: Clock, seconds_per_step: float = 1.0) -> None:
    """Two epochs of 100 steps of ``seconds_per_step``, 5 s of validation after each."""
    for epoch in (1, 2):
        for done in range(1, 101):
            clock.now += seconds_per_step
            bar.update(epoch, 3, done, 100, step=(epoch - 1) * 100 + done)
        clock.now += 5.0
        bar.epoch_end(f"epoch {epoch} step {epoch * 100} train_loss=0.5 loss=0.25")


def test_off_a_terminal_a_plain_line_every_30_s_and_each_epochs_summary(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock)
    log = io.StringIO()
    _two_epochs(Progress(log), clock)
    assert log.getvalue().splitlines() == [
        "epoch 1/3: 31/100 batches (31%) [00:30<01:09,  1.00batch/s, run ETA 04:29]",
        "epoch 1/3: 61/100 batches (61%) [01:00<00:39,  1.00batch/s, run ETA 03:59]",
        "epoch 1/3: 91/100 batches (91%) [01:30<00:09,  1.00batch/s, run ETA 03:29]",
        "epoch 1 step 100 train_loss=0.5 loss=0.25 (104.0 s, run ETA 03:28)",
        "epoch 2/3: 31/100 batches (31%) [00:30<01:09,  1.00batch/s, run ETA 02:53]",
        "epoch 2/3: 61/100 batches (61%) [01:00<00:39,  1.00batch/s, run ETA 02:23]",
        "epoch 2/3: 91/100 batches (91%) [01:30<00:09,  1.00batch/s, run ETA 01:53]",
        "epoch 2 step 200 train_loss=0.5 loss=0.25 (105.0 s, run ETA 01:45)",
    ]


def test_off_a_terminal_short_epochs_write_only_their_summaries(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock)
    log = io.StringIO()
    _two_epochs(Progress(log), clock, seconds_per_step=0.25)  # 25 s of steps: no 30 s line
    assert log.getvalue().splitlines() == [  # the first epoch timed from its first step
        "epoch 1 step 100 train_loss=0.5 loss=0.25 (29.8 s, run ETA 00:59)",
        "epoch 2 step 200 train_loss=0.5 loss=0.25 (30.0 s, run ETA 00:30)",
    ]
    # an epoch just past 30 s: one line at the 30 s mark, then none until the next 30 s
    log = io.StringIO()
    bar = Progress(log)
    for done in range(1, 51):
        clock.now += 0.625  # 31.25 s of steps
        bar.update(1, 1, done, 50)
    assert log.getvalue().splitlines() == [
        "epoch 1/1: 49/50 batches (98%) [00:30<00:00,  1.60batch/s]"
    ]


def test_a_terminal_gets_a_bar_with_rate_and_etas_replaced_by_the_summary(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "monotonic", clock)
    tty = Tty()
    _two_epochs(Progress(tty), clock)
    text = tty.getvalue()
    first = text.split("epoch 1 step 100", 1)[0]
    frames = [f for f in first.split("\r") if f.strip()]
    # tqdm's bar: percentage, count, elapsed<remaining, its rate; ours: the run's ETA
    assert frames[-1].startswith("epoch 1/3: 100%|") and "| 100/100 [" in frames[-1]
    assert all("batch/s" in f or "s/batch" in f for f in frames)
    assert any("run ETA" in f for f in frames)
    assert "<" in frames[0]  # the epoch's remaining time
    # the bar's line is cleared, then the summary takes it
    assert "\r" + " " * 20 in first[-200:]
    assert text.endswith("\repoch 2 step 200 train_loss=0.5 loss=0.25 (105.0 s, run ETA 01:45)\n")


def _read_through(leader: int, end: bytes) -> str:
    """Everything the terminal shows up to `end`: one read may return only part of it."""
    shown = b""
    while not shown.endswith(end):
        ready, _, _ = select.select([leader], [], [], 60)
        assert ready, f"the terminal stopped before {end!r}: {shown!r}"
        shown += os.read(leader, 65536)
    return shown.decode()


@pytest.mark.parametrize("size", [(24, 100), (0, 0)])  # a pseudo terminal may report no size
def test_a_real_pseudo_terminal_is_drawn_on_and_nothing_reaches_stdout(size, capfd):
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    with os.fdopen(follower, "w") as stream:
        bar = Progress(stream)
        assert bar.tty
        for done in range(1, 5):
            bar.update(1, 2, done, 4)
        bar.epoch_end("epoch 1 step 4 train_loss=0.5")
        shown = _read_through(leader, b"run ETA 00:00)\r\n")
    os.close(leader)
    assert "epoch 1/2: 100%|" in shown and "| 4/4 [" in shown and "batch/s" in shown
    assert re.search(r"\repoch 1 step 4 train_loss=0\.5 \(\d+\.\d s\, run ETA 00:00\)\r\n$", shown)
    assert capfd.readouterr().out == ""


def test_other_ranks_of_a_distributed_run_write_nothing(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    log, seen = io.StringIO(), []
    bar = Progress(log, listener=seen.append)
    bar.update(1, 2, 1, 4)
    bar.epoch_end("epoch 1")
    assert log.getvalue() == "" and len(seen) == 2  # the listener still hears every rank


def test_training_writes_its_summaries_to_stderr_and_nothing_to_stdout(tmp_path, capfd):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Nitro(Regression(max_epochs=2, samples=64), run_dir=tmp_path).train()
    out, err = capfd.readouterr()
    assert out == ""
    summaries = [line for line in err.splitlines() if line.startswith("epoch ")]
    assert [s.split(" step")[0] for s in summaries] == ["epoch 1", "epoch 2"]
    assert "run ETA" in summaries[0] and "run ETA" not in summaries[1]


# -- Ctrl+C ------------------------------------------------------------------------------
CHILD = """
import sys
from nitro_core import Nitro
from nitro_core.examples import Regression

def on_epoch(row):
    print(f"epoch {row['epoch']}", flush=True)
    sys.stdin.readline()  # the test presses Ctrl+C here, then sends a line to go on

n = Nitro(Regression(max_epochs=50, samples=64), run_dir=sys.argv[1]).train(on_epoch=on_epoch)
print(f"stopped at epoch {n.epoch}: {n.stop_reason}", flush=True)
"""


class Child:
    """A process training a Regression, its output read line by line as it comes."""

    def __init__(self, run_dir: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(run_dir)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        self.lines: dict[str, queue.Queue[str]] = {"out": queue.Queue(), "err": queue.Queue()}
        self.seen: dict[str, list[str]] = {"out": [], "err": []}
        self.pumps = [
            threading.Thread(target=self._pump, args=(pipe, name), daemon=True)
            for name, pipe in (("out", self.proc.stdout), ("err", self.proc.stderr))
        ]
        for pump in self.pumps:
            pump.start()

    def _pump(self, pipe, name: str) -> None:
        for line in pipe:
            self.lines[name].put(line.rstrip("\n"))

    def wait_for(self, name: str, text: str) -> None:
        while True:
            try:
                # a hang guard only: a loaded machine may take minutes to import torch
                line = self.lines[name].get(timeout=600)
            except queue.Empty:
                self.proc.kill()
                raise AssertionError(f"no {text!r} on std{name}: {self.seen[name]}") from None
            self.seen[name].append(line)
            if line == text:
                return

    def go_on(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def end(self) -> int:
        """Its exit status, once it exited and its output was read to the end."""
        code = self.proc.wait(timeout=600)
        for pump in self.pumps:
            pump.join(timeout=30)
        for name, lines in self.lines.items():
            while not lines.empty():
                self.seen[name].append(lines.get())
        return code


@pytest.mark.slow  # a SIGINT to a training subprocess: the slow suite (the default stays under 4 minutes)
def test_the_first_ctrl_c_says_it_stops_after_this_epoch_and_does(tmp_path):
    child = Child(tmp_path)
    child.wait_for("out", "epoch 1")
    child.proc.send_signal(signal.SIGINT)  # inside on_epoch of epoch 1: epoch 2 still trains
    child.wait_for("err", STOPPING)
    child.go_on()
    child.wait_for("out", "epoch 2")
    child.go_on()
    assert child.end() == 0
    assert child.seen["out"][-1] == "stopped at epoch 2: requested"
    assert STOPPING == "stopping after this epoch; Ctrl+C again to interrupt"
    assert child.seen["err"].count(STOPPING) == 1
    # stderr is a pipe here: each epoch's summary is a plain line
    assert [e for e in child.seen["err"] if e.startswith("epoch 1 step")]


@pytest.mark.slow
def test_a_second_ctrl_c_interrupts_at_once(tmp_path):
    child = Child(tmp_path)
    child.wait_for("out", "epoch 1")
    child.proc.send_signal(signal.SIGINT)
    child.wait_for("err", STOPPING)
    child.proc.send_signal(signal.SIGINT)  # interrupts the wait inside epoch 1's on_epoch
    assert child.end() == -signal.SIGINT
    assert "KeyboardInterrupt" in child.seen["err"]
    assert child.seen["out"] == ["epoch 1"]  # no second epoch, no return from train()
