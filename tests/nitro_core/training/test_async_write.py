"""Asynchronous checkpoint writes (``Checkpointer(async_write=True)``, the default): the step
waits only for the copy to host buffers; the record, written later on the writer thread,
holds the state of its point and not of a later step; one write is in flight, a point that
arrives meanwhile waits (and says so); the manifest lists a record only once it is durable;
a failed write raises at the next point or at the end of ``train()``, the same error a
synchronous write raises; ``train()`` returns after the last commit."""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import warnings

import pytest
import torch

from nitro_core import DiskFull, Nitro, read_manifest
from nitro_core.state.hostcopy import HostCopier
from nitro_core.store import recordio, safeio
from nitro_core.store.recordio import read_record

from ..steps import Steps


def writer_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("nitro-writer")]


def gated_writes(monkeypatch) -> threading.Event:
    """Every record write waits for the returned event before it starts."""
    gate, real = threading.Event(), recordio.write_record

    def write_record(target, tensors, meta):
        assert gate.wait(60), "the test never opened the gate"
        return real(target, tensors, meta)

    monkeypatch.setattr(recordio, "write_record", write_record)
    return gate


def slow_writes(monkeypatch, seconds: float) -> None:
    real = recordio.write_record

    def write_record(target, tensors, meta):
        time.sleep(seconds)
        return real(target, tensors, meta)

    monkeypatch.setattr(recordio, "write_record", write_record)


def test_a_record_holds_its_point_state_though_later_steps_ran_before_the_write(
    tmp_path, monkeypatch
):
    gate = gated_writes(monkeypatch)
    n = Nitro(Steps(keep=100, max_epochs=1), run_dir=tmp_path)
    original, calls, at_point = n.experiment.loss, [], {}

    def loss(model, batch):
        if model.training:
            calls.append(1)
            if len(calls) == 6:  # steps 4 and 5 changed every tensor; now let step 3's write go
                gate.set()
        return original(model, batch)

    def on_point(row):
        if row["step"] == 3:  # its write is queued and blocked: what it must hold, copied now
            at_point["params"] = {k: v.clone() for k, v in n.model.state_dict().items()}
            state = n.optimizer.state_dict()["state"]
            at_point["optim"] = {i: {k: v.clone() for k, v in s.items()} for i, s in state.items()}
            assert not [e for e in read_manifest(tmp_path) if e.step == 3]  # not durable: unlisted

    object.__setattr__(n.experiment, "loss", loss)
    n.train(on_epoch=on_point)
    (entry,) = [e for e in read_manifest(tmp_path) if e.step == 3]
    tensors, _ = read_record(tmp_path / entry.file, entry.expected)
    for k, v in at_point["params"].items():
        assert torch.equal(tensors[f"params/{k}"], v), k
        assert not torch.equal(n.model.state_dict()[k], v), f"{k}: later steps changed nothing"
    for i, slots in at_point["optim"].items():
        for k, v in slots.items():
            assert torch.equal(tensors[f"optim/state/{i}/{k}"], v), (i, k)


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_a_point_arriving_during_a_write_waits_for_it_and_says_so(tmp_path, monkeypatch, caplog):
    slow_writes(monkeypatch, 0.3)
    with caplog.at_level(logging.INFO, logger="nitro_core.training.checkpointing"):
        Nitro(Steps(every=1, keep=100, max_epochs=1), run_dir=tmp_path).train()
    assert [e.step for e in read_manifest(tmp_path)] == list(range(1, 9))  # none dropped
    waits = [r.getMessage() for r in caplog.records if "waits for the write" in r.getMessage()]
    assert waits, "no point waited for the write in flight"
    assert re.fullmatch(
        r"The checkpoint point at epoch 1 batch 2 \(step 2\) waits for the write of "
        r"'epoch-0001-batch-0001-step-1-loss=[^']+\.safetensors', still in flight",
        waits[0],
    ), waits[0]
    assert waits[-1].startswith("The end of train() waits for the write of 'epoch-0001-step-8")


def test_train_returns_only_after_the_last_write_is_committed(tmp_path, monkeypatch):
    slow_writes(monkeypatch, 0.5)
    n = Nitro(Steps(every=None, max_epochs=2), run_dir=tmp_path).train()
    last = read_manifest(tmp_path)[-1]
    assert (last.epoch, last.batch, last.step, last.stop_reason) == (2, None, n.step, "completed")
    assert not list(tmp_path.glob("*.tmp")) and writer_threads() == []


def test_synchronous_writes_commit_before_the_point_ends_and_start_no_thread(tmp_path):
    listed = []

    def on_point(row):
        listed.append([e.step for e in read_manifest(tmp_path)][-1])
        assert writer_threads() == []

    Nitro(Steps(async_write=False, keep=100), run_dir=tmp_path).train(on_epoch=on_point)
    assert listed == [3, 6, 8, 9, 12, 15, 16, 18, 21, 24]


def disk_full_run(tmp_path, async_write: bool, monkeypatch) -> tuple[DiskFull, bytes, int]:
    """Train epoch 1, then epoch 2 on a disk with 4096 bytes free: (the error, the manifest
    before epoch 2, batches trained in epoch 2)."""
    exp = Steps(every=None, async_write=async_write, schedule=False, max_epochs=1)
    Nitro(exp, run_dir=tmp_path).train()
    before = (tmp_path / "manifest.json").read_bytes()
    n = Nitro(exp.model_copy(update={"max_epochs": 2}), run_dir=tmp_path, resume="auto")
    monkeypatch.setattr(safeio, "free_bytes", lambda directory: 4096)
    with pytest.raises(DiskFull) as err:
        n.train()
    monkeypatch.undo()
    return err.value, before, n.step


def test_a_disk_full_in_a_background_write_reaches_the_caller_as_a_synchronous_one_would(
    tmp_path, monkeypatch
):
    error, before, _ = disk_full_run(tmp_path / "async", True, monkeypatch)
    sync_error, _, _ = disk_full_run(tmp_path / "sync", False, monkeypatch)
    assert type(error) is type(sync_error)
    # The record's size differs by its header's padding: it names the run directory it
    # resumed from, and "async" is one character longer than "sync".
    sizes = re.compile(r"needs \d+ bytes \(\d+ for the record")
    assert sizes.search(str(error)), str(error)
    assert sizes.sub("needs N bytes (N for the record", str(error)) == sizes.sub(
        "needs N bytes (N for the record", str(sync_error).replace("/sync", "/async")
    )
    assert str(error).startswith(
        f"No room left in {str(tmp_path / 'async')!r} to commit 'epoch-0002"
    )
    run = tmp_path / "async"
    assert (run / "manifest.json").read_bytes() == before  # the manifest, byte for byte
    assert [e.epoch for e in read_manifest(run)] == [1]
    assert not list(run.glob("*.tmp")) and len(list(run.glob("*.safetensors"))) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exp = Steps(every=None, schedule=False, max_epochs=2)
        n = Nitro(exp, run_dir=run, resume="auto").train()
    assert [e.epoch for e in read_manifest(run)] == [1, 2] and n.step == 16


def test_a_failed_background_write_is_raised_at_the_next_point(tmp_path, monkeypatch):
    free = iter([4096])  # the first write finds the disk full, every later one has room
    monkeypatch.setattr(safeio, "free_bytes", lambda directory: next(free, 10**12))
    n = Nitro(Steps(keep=100), run_dir=tmp_path)
    original, calls = n.experiment.loss, []

    def loss(model, batch):
        if model.training:
            calls.append(1)
        return original(model, batch)

    object.__setattr__(n.experiment, "loss", loss)
    with pytest.raises(DiskFull) as err:
        n.train()
    assert "to commit 'epoch-0001-batch-0003-step-3-loss=" in str(err.value)
    assert len(calls) == 6  # raised at the point after step 6, the next one
    assert read_manifest(tmp_path) == [] and not list(tmp_path.glob("*.safetensors*"))
    assert writer_threads() == []


def test_the_host_copier_reuses_its_buffers_and_copies_the_values():
    copier = HostCopier()
    live = torch.arange(6.0)
    first = copier("params/w", live)
    copier.finish()
    live.add_(1)  # the next step
    assert torch.equal(first, torch.arange(6.0)) and first.data_ptr() != live.data_ptr()
    second = copier("params/w", live)
    copier.finish()
    assert second.data_ptr() == first.data_ptr() and torch.equal(second, live)
    copier("params/v", torch.zeros(3))
    copier.finish()  # params/w was not in this record: its buffer is dropped
    assert copier.nbytes == 3 * 4


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_leaves_are_copied_into_pinned_host_buffers():
    copier = HostCopier()
    live = torch.randn(1024, 1024, device="cuda")
    host = copier("params/w", live)
    copier.finish()
    live.add_(1)
    torch.cuda.synchronize()
    assert host.is_pinned() and host.device.type == "cpu"
    assert torch.equal(host, (live - 1).cpu())


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no thread priorities")
def test_the_writer_thread_runs_at_the_training_threads_priority(tmp_path, monkeypatch):
    # a writer niced below training was starved on a CPU run (torch's threads keep every
    # core busy) and still in flight at the next point, which then waited for it
    seen = []
    real = recordio.write_record

    def write_record(target, tensors, meta):
        assert threading.current_thread().name.startswith("nitro-writer")  # not the loop's
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return real(target, tensors, meta)

    monkeypatch.setattr(recordio, "write_record", write_record)
    Nitro(Steps(every=4, max_epochs=1), run_dir=tmp_path).train()
    assert seen and set(seen) == {os.getpriority(os.PRIO_PROCESS, threading.get_native_id())}
