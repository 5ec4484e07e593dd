"""Reliability under real failures: SIGKILLed writers, concurrent writers in one directory,
a non-finite score, corrupted records. Real processes (``_worker.py``), real files, no mocks."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from nitro_core import (
    CheckpointCorrupt,
    Checkpointer,
    Experiment,
    Host,
    Last,
    MonitorError,
    Nitro,
    NitroWarning,
    TensorBatches,
    checkpoint_info,
    read_manifest,
    runs,
)
from nitro_core.examples import Classifier
from nitro_core.store.recordio import RecordFile, file_sha256, read_record

pytestmark = pytest.mark.slow

WORKER = Path(__file__).parents[1] / "_worker.py"
START_TIMEOUT = 60  # seconds for a worker to import torch and set up
RUN_TIMEOUT = 120  # seconds for a worker to train to its end


# -- helpers ------------------------------------------------------------------------------------
class Workers:
    """Worker processes started by one test; any still running at teardown is killed."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []
        self.logs: dict[int, Path] = {}

    def start(self, name: str, run_dir: Path, *args: object) -> subprocess.Popen:
        log = self.tmp_path / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, str(WORKER), str(run_dir), *map(str, args)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        self.logs[proc.pid] = log
        return proc

    def output(self, proc: subprocess.Popen) -> str:
        return self.logs[proc.pid].read_text(errors="replace")[-4000:]

    def wait_ready(self, proc: subprocess.Popen, ready: Path, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not ready.exists():
            if proc.poll() is not None:
                out = self.output(proc)
                pytest.fail(f"{what}: worker exited {proc.returncode} before training:\n{out}")
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: worker not ready after {START_TIMEOUT} s")
            time.sleep(0.005)

    def finish(self, proc: subprocess.Popen, what: str) -> None:
        """Wait for a worker to train to its end; it must exit 0."""
        rc = proc.wait(timeout=RUN_TIMEOUT)
        assert rc == 0, f"{what}: worker exited {rc}:\n{self.output(proc)}"

    def kill(self, proc: subprocess.Popen, what: str) -> None:
        """SIGKILL a worker that must still be running."""
        os.kill(proc.pid, signal.SIGKILL)
        rc = proc.wait(timeout=30)
        assert rc == -signal.SIGKILL, (
            f"{what}: worker was not running when SIGKILLed (exit {rc}):\n{self.output(proc)}"
        )

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


@pytest.fixture
def workers(tmp_path: Path):
    w = Workers(tmp_path)
    yield w
    w.close()


def manifest_problems(run_dir: Path) -> list[str]:
    """What is wrong between the manifest and the files it lists (empty: consistent)."""
    try:
        entries = read_manifest(run_dir)
    except Exception as exc:
        return [f"manifest unreadable: {type(exc).__name__}: {exc}"]
    problems = []
    files = [e.file for e in entries]
    if len(set(files)) != len(files):
        problems.append(f"a file is listed twice: {files}")
    for e in entries:
        path = run_dir / e.file
        if e.file.endswith(".tmp"):
            problems.append(f"{e.file}: a .tmp file is listed")
        if not path.is_file():
            problems.append(f"{e.file}: listed but missing")
            continue
        size = path.stat().st_size
        if size != e.bytes:
            problems.append(f"{e.file}: {size} bytes on disk, the entry says {e.bytes}")
            continue
        try:
            RecordFile(path, e.expected).verify()  # the header against the entry, every section
        except CheckpointCorrupt as exc:
            problems.append(f"{e.file}: {exc}")
            continue
        header = checkpoint_info(path)
        if (header["run"], header["epoch"], header["step"]) != (e.run, e.epoch, e.step):
            problems.append(
                f"{e.file}: header says run {header['run']} epoch {header['epoch']} step "
                f"{header['step']}, the entry run {e.run} epoch {e.epoch} step {e.step}"
            )
    return problems


def directory_state(run_dir: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``run_dir``."""
    return {
        str(p.relative_to(run_dir)): file_sha256(p)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def load_final(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


# -- 1. SIGKILL while records are written ------------------------------------------------------
def test_sigkill_during_record_writes_leaves_a_consistent_manifest(tmp_path, workers):
    rnd = random.Random(20240601)
    run_dir = tmp_path / "run"
    kills, mid_write = 20, 0

    def launch(i: int) -> tuple[subprocess.Popen, Path, Path]:
        """Worker i imports torch at once, then holds until its hold file appears."""
        hold, ready = tmp_path / f"hold-{i}", tmp_path / f"ready-{i}"
        args = ("--experiment", "big", "--hold", hold, "--ready", ready)
        return workers.start(f"kill-{i}", run_dir, *args), hold, ready

    upcoming = [launch(0), launch(1)]  # two workers import ahead, each held until its turn
    for i in range(kills):
        proc, hold, ready = upcoming.pop(0)
        hold.touch()  # only now may it touch run_dir: worker i - 1 is dead and checked
        workers.wait_ready(proc, ready, f"iteration {i}")
        started = time.time_ns()
        if i + 2 < kills:
            upcoming.append(launch(i + 2))
        time.sleep(rnd.uniform(0.0, 0.7))
        workers.kill(proc, f"iteration {i}")
        mid_write += any(p.stat().st_mtime_ns >= started for p in run_dir.glob("*.safetensors.tmp"))
        problems = manifest_problems(run_dir)
        assert not problems, f"after SIGKILL {i}: " + "; ".join(problems)

    entries = read_manifest(run_dir)
    assert entries, f"no record was committed in {kills} launches: the kill window is too early"
    assert mid_write, f"none of {kills} kills landed during a record write: the window is mis-sized"
    before = entries[-1].epoch

    proc = workers.start("final", run_dir, "--experiment", "big", "--max-epochs", before + 2)
    workers.finish(proc, "final resume='auto' run")
    problems = manifest_problems(run_dir)
    assert not problems, "after the final run: " + "; ".join(problems)
    last = read_manifest(run_dir)[-1]
    assert last.epoch > before, f"final entry at epoch {last.epoch}, before it {before}"
    assert (last.epoch, last.stop_reason) == (before + 2, "completed")
    stale = sorted(p.name for p in run_dir.iterdir() if ".stale" in p.name)
    assert not stale, f"leftovers of dead writers were not reclaimed: {stale}"
    shutil.rmtree(run_dir)  # ~1 GB of records and set-aside leftovers


# -- 2. resume after SIGKILL == uninterrupted --------------------------------------------------
@pytest.mark.parametrize(
    ("experiment", "samples", "kill_seed"),
    [("regression", 50000, 1), ("classifier", 40000, 2)],
    ids=["regression-seed1", "classifier-seed2"],
)
def test_resume_after_sigkill_equals_uninterrupted_run(
    tmp_path, workers, experiment, samples, kill_seed
):
    common = ("--experiment", experiment, "--samples", samples, "--max-epochs", 4)
    dir_a, dir_b = tmp_path / "A", tmp_path / "B"
    out_a, out_c = tmp_path / "A.safetensors", tmp_path / "C.safetensors"
    ready_b, hold_c = tmp_path / "ready-B", tmp_path / "hold-C"
    run_a = workers.start("A", dir_a, *common, "--resume", "false", "--out", out_a)
    run_b = workers.start("B", dir_b, *common, "--resume", "false", "--ready", ready_b)
    # C imports torch now, and touches dir B only once B is dead
    run_c = workers.start("C", dir_b, *common, "--resume", "auto", "--hold", hold_c, "--out", out_c)
    workers.wait_ready(run_b, ready_b, "run B")
    time.sleep(random.Random(kill_seed).uniform(0.0, 0.8))
    workers.kill(run_b, "run B")
    problems = manifest_problems(dir_b)
    assert not problems, "run B after SIGKILL: " + "; ".join(problems)
    epochs_before = [e.epoch for e in read_manifest(dir_b)]
    hold_c.touch()
    workers.finish(run_c, f"run C (resume='auto' after B's kill; B had epochs {epochs_before})")
    workers.finish(run_a, "run A (uninterrupted)")

    final = read_manifest(dir_b)[-1]
    assert (final.epoch, final.stop_reason) == (4, "completed")
    tensors_a, meta_a = load_final(out_a)
    tensors_c, meta_c = load_final(out_c)
    assert sorted(tensors_a) == sorted(tensors_c)
    differ = [k for k in tensors_a if not torch.equal(tensors_a[k], tensors_c[k])]
    assert not differ, f"resumed after B's epochs {epochs_before}, these differ: {differ}"
    for key in ("epoch", "step", "param_groups"):
        assert meta_a[key] == meta_c[key], key


# -- 3. two processes, one run directory --------------------------------------------------------
def _logged_val_losses(run_dir: Path, run: str) -> dict[int, float]:
    rows = [
        json.loads(line) for line in (run_dir / "logs" / f"{run}.jsonl").read_text().splitlines()
    ]
    return {row["epoch"]: row["val"]["loss"] for row in rows}


def test_two_processes_share_a_run_directory(tmp_path, workers):
    run_dir, go = tmp_path / "run", tmp_path / "go"
    args = ("--experiment", "shared", "--samples", 2000, "--max-epochs", 6, "--go", go)
    procs = []
    for name in ("P", "Q"):
        ready = tmp_path / f"ready-{name}"
        procs.append((workers.start(name, run_dir, *args, "--ready", ready), ready))
    for proc, ready in procs:
        workers.wait_ready(proc, ready, "concurrent worker")
    go.touch()  # both start training at once
    for proc, _ in procs:
        workers.finish(proc, "concurrent worker")

    problems = manifest_problems(run_dir)  # exists, size, digests, header run/epoch/step
    assert not problems, "; ".join(problems)
    entries = read_manifest(run_dir)
    ids = runs(run_dir)
    assert len(ids) == 2, f"runs {ids}"

    losses = {run: _logged_val_losses(run_dir, run) for run in ids}
    assert losses[ids[0]] == losses[ids[1]], "same seed and config, yet the runs differ"
    for run in ids:
        mine = [e for e in entries if e.run == run]
        by_loss = sorted(losses[run].items(), key=lambda kv: (kv[1], kv[0]))
        expected = {epoch for epoch, _ in by_loss[:2]} | {6}
        assert sorted(e.epoch for e in mine) == sorted(expected), f"run {run}: {mine}"
        for e in mine:
            assert e.score == losses[run][e.epoch], f"run {run}: {e}"
            assert e.stop_reason == ("completed" if e.epoch == 6 else None), f"run {run}: {e}"

    # same seed => same names: whichever run claimed a name second got "-run-<its id>" inserted
    def base(file: str) -> str:
        return re.sub(r"-run-[0-9a-f]+(?=\.safetensors$)", "", file)

    listing = "\n".join(f"  {e.run} epoch {e.epoch} {e.file}" for e in entries)
    groups: dict[str, list] = {}
    for e in entries:
        assert "-run-" not in e.file or e.file.endswith(f"-run-{e.run}.safetensors"), listing
        groups.setdefault(base(e.file), []).append(e)
    shared = {name: group for name, group in groups.items() if len(group) > 1}
    assert shared, f"no file name collided:\n{listing}"
    for name, group in shared.items():
        assert len(group) == 2 and group[0].run != group[1].run, f"{name}:\n{listing}"
        plain = [e for e in group if e.file == name]
        assert len(plain) == 1, f"{name}: not exactly one run holds the plain name:\n{listing}"
        (other,) = (e for e in group if e is not plain[0])
        suffixed = name.removesuffix(".safetensors") + f"-run-{other.run}.safetensors"
        assert other.file == suffixed, f"{name}: the second claimant got {other.file}:\n{listing}"


# -- 4. a NaN score is refused, nothing on disk lost --------------------------------------------
class PoisonablePasses:
    """A 'val' split that counts its passes and poisons its batches on pass ``poison_on``,
    calling ``before_poison`` first (set by the test)."""

    def __init__(self, inner: TensorBatches, poison_on: int) -> None:
        self.inner, self.poison_on, self.passes = inner, poison_on, 0
        self.before_poison = None

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self):
        self.passes += 1
        poisoned = self.passes == self.poison_on
        if poisoned and self.before_poison is not None:
            self.before_poison()
        for batch in self.inner:
            yield {**batch, "poison": poisoned}


class NanAtEpoch3(Experiment):
    """y = 2x on 32 rows; the validation loss is NaN on the 3rd validation."""

    max_epochs: Host[int] = 5

    def build_data(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(32, 4, generator=g)
        y = 2 * x.sum(1, keepdim=True)
        return {
            "train": TensorBatches({"x": x, "y": y}, 8, shuffle=True),
            "val": PoisonablePasses(TensorBatches({"x": x[:16], "y": y[:16]}, 8), poison_on=3),
        }

    def build_model(self):
        return torch.nn.Linear(4, 1)

    def loss(self, model, batch):
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        return loss * float("nan") if batch.get("poison") else loss


def test_nan_score_is_refused_and_nothing_on_disk_is_lost(tmp_path):
    run_dir = tmp_path / "run"
    nitro = Nitro(NanAtEpoch3(), run_dir=run_dir)
    seen: dict[str, dict[str, str]] = {}
    nitro.data["val"].before_poison = lambda: seen.setdefault("before", directory_state(run_dir))
    with pytest.raises(MonitorError) as err:
        nitro.train()
    nitro.logger.close()  # the handle has no close() of its own
    message = str(err.value)
    assert "'loss'" in message and "epoch 3" in message, message

    assert [e.epoch for e in read_manifest(run_dir)] == [1, 2]
    problems = manifest_problems(run_dir)
    assert not problems, "; ".join(problems)
    assert "before" in seen, "the third validation never ran"
    after = directory_state(run_dir)
    changed = sorted(
        k for k in after.keys() | seen["before"].keys() if after.get(k) != seen["before"].get(k)
    )
    assert not changed, f"changed on disk after the NaN at epoch 3: {changed}"
    resumed = Nitro(NanAtEpoch3(), run_dir=run_dir, resume="auto")
    resumed.logger.close()
    assert (resumed.epoch, resumed.run_id) == (2, nitro.run_id)


# -- 5. corrupted records -------------------------------------------------------------------
class LastThree(Classifier):
    def checkpointer(self):
        return Checkpointer(keep=Last(3))


def _flip_a_data_bit(path: Path) -> None:
    """Flip one bit in the tensor bytes (past the header, which still parses)."""
    raw = bytearray(path.read_bytes())
    header_end = 8 + int.from_bytes(raw[:8], "little")
    raw[(header_end + len(raw)) // 2] ^= 0x10
    path.write_bytes(bytes(raw))


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def test_truncated_and_bitflipped_records_raise_checkpoint_corrupt(tmp_path):
    run_dir = tmp_path / "run"
    exp = LastThree(samples=256, max_epochs=4)
    Nitro(exp, run_dir=run_dir).train().logger.close()
    entries = read_manifest(run_dir)
    assert [e.epoch for e in entries] == [2, 3, 4]
    oldest, middle, latest = (run_dir / e.file for e in entries)

    _truncate(oldest)
    _flip_a_data_bit(middle)
    for path, entry in ((oldest, entries[0]), (middle, entries[1])):
        with pytest.raises(CheckpointCorrupt) as err:
            read_record(path, entry.expected)
        assert str(path) in str(err.value), str(err.value)
    with pytest.raises(CheckpointCorrupt) as err:
        checkpoint_info(oldest)  # a truncation shows in the header alone
    assert str(oldest) in str(err.value), str(err.value)
    tensors, meta = read_record(latest, entries[2].expected)
    assert meta["epoch"] == 4 and tensors

    intact = latest.read_bytes()
    resumed = Nitro(exp, run_dir=run_dir, resume="auto")
    resumed.logger.close()
    assert resumed.epoch == 4
    for corrupt in (_flip_a_data_bit, _truncate):
        latest.write_bytes(intact)
        corrupt(latest)
        with pytest.raises(CheckpointCorrupt) as err:
            Nitro(exp, run_dir=run_dir, resume="auto")
        assert str(latest) in str(err.value), f"{corrupt.__name__}: {err.value}"


# -- 6. leftovers of a killed writer are reclaimed ----------------------------------------------
def _unlisted(run_dir: Path) -> dict[str, int]:
    """Record files (final or .tmp) no manifest entry lists -> their size."""
    listed = (
        {e.file for e in read_manifest(run_dir)} if (run_dir / "manifest.json").exists() else set()
    )
    return {
        p.name: p.stat().st_size
        for p in run_dir.iterdir()
        if p.name.endswith((".safetensors", ".safetensors.tmp")) and p.name not in listed
    }


def test_leftovers_of_a_killed_writer_are_reclaimed_once_it_is_dead(tmp_path, workers):
    from .._worker import BigRecords

    run_dir, ready = tmp_path / "run", tmp_path / "ready"
    proc = workers.start(
        "killed", run_dir, "--experiment", "big", "--resume", "false", "--ready", ready
    )
    workers.wait_ready(proc, ready, "writer")
    deadline = time.monotonic() + RUN_TIMEOUT
    while not any(p.stat().st_size for p in run_dir.glob("*.safetensors.tmp")):
        assert proc.poll() is None, workers.output(proc)
        assert time.monotonic() < deadline, "no record write started"
        time.sleep(0.001)
    workers.kill(proc, "writer")  # mid-write: its .tmp (or an unlisted record) stays behind
    left = _unlisted(run_dir)
    assert left, "the kill left nothing behind"
    epoch = read_manifest(run_dir)[-1].epoch if (run_dir / "manifest.json").exists() else 0

    torch.set_num_threads(1)
    with pytest.warns(
        NitroWarning
    ) as caught:  # the next write sets it aside, the one after reclaims it
        n = Nitro(BigRecords(max_epochs=epoch + 2), run_dir=run_dir, resume="auto").train()
    n.logger.close()
    messages = [str(w.message) for w in caught]
    reclaimed = [m for m in messages if m.startswith("Reclaimed ")]
    assert reclaimed == [
        f"Reclaimed {sum(left.values())} bytes in {str(run_dir)!r}: removed {len(left)} leftover "
        f"file(s) of interrupted writes ("
        + ", ".join(repr(name + ".stale") for name in sorted(left))
        + "), which no manifest lists and no live process holds."
    ], messages
    assert not [p.name for p in run_dir.iterdir() if ".stale" in p.name or p.name.endswith(".tmp")]
    assert not manifest_problems(run_dir)
