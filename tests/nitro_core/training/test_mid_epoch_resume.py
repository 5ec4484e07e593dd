"""Exact mid-epoch resume: run A == run B (stopped at a mid-epoch point) + run C (resumed
from B's mid-epoch record), at step granularity, for a split that says where it is
(``TensorBatches``, torchdata's ``StatefulDataLoader``: O(1)) and for a plain re-iterable
(replayed from the epoch's start, with a warning)."""

from __future__ import annotations

import importlib.util
import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from nitro_core import Nitro, NitroWarning, ResumeRefused, TensorBatches, read_manifest
from nitro_core.store.recordio import read_header
from tests.nitro_core.training.test_resume import assert_same_state

from ..steps import Steps, stop_at_step

HAS_TORCHDATA = importlib.util.find_spec("torchdata") is not None
needs_torchdata = pytest.mark.skipif(not HAS_TORCHDATA, reason="pip install torchdata>=0.11")


def assert_same_run(a: Nitro, c: Nitro) -> None:
    """Parameters, optimizer, schedule, step, generators and history rows (but seconds)."""
    assert_same_state(a, c)  # parameters, optimizer, step, epoch, validation rows
    assert a.scheduler.state_dict() == c.scheduler.state_dict()
    assert (a.step, a.epoch, a.batch) == (c.step, c.epoch, c.batch)
    strip = [[{k: v for k, v in r.items() if k != "seconds"} for r in n.history] for n in (a, c)]
    assert strip[0] == strip[1]


def a_b_c(tmp_path: Path, exp: Steps, stop: int) -> tuple[Nitro, Nitro, Nitro, torch.Tensor]:
    """A uninterrupted; B stopped at the point after step ``stop``; C resumed from B.
    Returns the handles and A's generator state at its end (C's is the current one)."""
    a = Nitro(exp.model_copy(), run_dir=tmp_path / "a").train()
    rng_a = torch.get_rng_state()
    b = Nitro(exp.model_copy(), run_dir=tmp_path / "b")
    stop_at_step(b, stop)
    b.train()
    assert (b.step, b.stop_reason) == (stop, "requested")
    torch.manual_seed(1234)  # C must not depend on where the generators happen to be
    c = Nitro(exp.model_copy(), run_dir=tmp_path / "b", resume="auto")
    assert (c.run_id, c.step, c.epoch, c.batch) == (b.run_id, b.step, b.epoch, b.batch)
    torch.randn(3)  # nor on a draw between construction and train()
    c.train()
    return a, b, c, rng_a


@pytest.mark.parametrize("stop", [3, 9, 15, 21])  # e1 b3, e2 b1, e2 b7, e3 b5
def test_tensor_batches_resume_mid_epoch_bit_for_bit(tmp_path, stop):
    a, b, c, rng_a = a_b_c(tmp_path, Steps(split="tensor"), stop)
    assert b.batch is not None, "B stopped at an epoch end: the test would not test mid-epoch"
    assert_same_run(a, c)
    assert torch.equal(rng_a, torch.get_rng_state())
    logs = [
        [json.loads(line) for line in (tmp_path / d / "logs" / f"{n.run_id}.jsonl").open()]
        for d, n in (("a", a), ("b", c))
    ]
    strip = [
        [{k: v for k, v in r.items() if k not in ("run", "seconds")} for r in rows] for rows in logs
    ]
    assert strip[0] == strip[1]


def test_a_plain_re_iterable_is_replayed_with_a_warning_and_resumes_exactly(tmp_path):
    exp = Steps(split="plain")
    a = Nitro(exp.model_copy(), run_dir=tmp_path / "a").train()
    b = Nitro(exp.model_copy(), run_dir=tmp_path / "b")
    stop_at_step(b, 12)  # epoch 2, batch 4
    b.train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = Nitro(exp.model_copy(), run_dir=tmp_path / "b", resume="auto")
        c.train()
    replays = [str(w.message) for w in caught if issubclass(w.category, NitroWarning)]
    assert replays == [
        "Resuming mid-epoch: the train split (PlainBatches) has no state_dict()/load_state_dict(), "
        "so its first 4 batches of epoch 2 are replayed from the epoch's start (read again and "
        "skipped, as long as reading them took; the model does not run) to reach the record's "
        "place. Return a split that can say where it is from build_data(), e.g. "
        "torchdata.stateful_dataloader.StatefulDataLoader or nitro_core.TensorBatches, and the "
        "resume costs O(1)."
    ]
    assert c.data["train"].passes == 2  # epoch 2 (replayed to batch 4, then trained), epoch 3
    assert_same_run(a, c)


def test_tensor_batches_resume_reads_no_batch_twice(tmp_path, monkeypatch):
    """The O(1) path positions the split: no pass replays the consumed batches."""
    b = Nitro(Steps(), run_dir=tmp_path)
    stop_at_step(b, 15)  # epoch 2, batch 7
    b.train()
    c = Nitro(Steps(), run_dir=tmp_path, resume="auto")
    split, yielded = c.data["train"], []
    original = TensorBatches.__iter__

    def counting(self):
        for batch in original(self):
            yielded.append(self is split)
            yield batch

    monkeypatch.setattr(TensorBatches, "__iter__", counting)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NitroWarning)  # no replay warning
        c.train()
    assert yielded.count(True) == (8 - 7) + 8  # the rest of epoch 2, then epoch 3


@pytest.mark.parametrize("split", ["tensor", "plain"])
def test_the_same_handle_continues_an_epoch_it_stopped_in(tmp_path, split):
    a = Nitro(Steps(split=split), run_dir=tmp_path / "a").train()
    b = Nitro(Steps(split=split), run_dir=tmp_path / "b")
    stop_at_step(b, 12)
    b.train()
    assert (b.epoch, b.batch, b.stop_reason) == (2, 4, "requested")
    torch.randn(3)  # a draw between the two calls moves nothing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NitroWarning)  # the plain split is replayed
        b.train()
    assert b.stop_reason == "completed"
    assert_same_run(a, b)


@needs_torchdata
@pytest.mark.parametrize("split", ["stateful0", "stateful2"])
def test_a_stateful_dataloader_resumes_mid_epoch_bit_for_bit(tmp_path, split):
    a, b, c, rng_a = a_b_c(tmp_path, Steps(split=split), 12)
    assert b.batch == 4
    assert_same_run(a, c)
    assert torch.equal(rng_a, torch.get_rng_state())


def test_the_record_holds_the_position_and_the_split_state(tmp_path):
    b = Nitro(Steps(), run_dir=tmp_path)
    stop_at_step(b, 9)
    b.train()
    entry = read_manifest(tmp_path)[-1]
    assert (entry.epoch, entry.batch, entry.step) == (2, 1, 9)
    assert re.fullmatch(r"epoch-0002-batch-0001-step-9-loss=[0-9.e-]+\.safetensors", entry.file)
    meta = read_header(tmp_path / entry.file)
    assert meta["batch"] == 1 and meta["data"]["yielded"] == 1
    assert set(meta["position"]) == {"batch", "loss_sum", "loss_dtype", "epoch_rng"}
    assert meta["position"]["loss_dtype"] == "float32"
    assert meta["data"]["order_rng"] == {"__tensor__": "rng/data/order_rng"}


def test_a_split_now_shorter_than_the_recorded_position_is_refused(tmp_path):
    b = Nitro(Steps(), run_dir=tmp_path)
    stop_at_step(b, 15)  # epoch 2, batch 7 of 8
    b.train()
    record = tmp_path / read_manifest(tmp_path)[-1].file

    class Shorter(Steps):
        def build_data(self):
            data = super().build_data()
            data["train"] = TensorBatches({"x": torch.zeros(24, 6), "y": torch.zeros(24, 1)}, 4)
            return data

    with pytest.raises(ResumeRefused) as err:
        Nitro(Shorter(), run_dir=tmp_path, resume="auto")
    assert str(err.value) == (
        f"Cannot resume {str(record)!r}: it was written after batch 7 of epoch 2, and the train "
        "split now yields 6 batches an epoch, so there is no next batch to continue from. "
        "Restore the data the record was trained on, or start a new run that takes only the "
        "weights: Nitro(exp, weights=...)."
    )


def test_tensor_batches_state_continues_its_pass_and_draws_like_before():
    x = torch.arange(10)
    torch.manual_seed(0)
    expected = torch.randperm(10)  # the order a pass drew before state_dict existed
    torch.manual_seed(0)
    tb = TensorBatches({"x": x}, 3, shuffle=True)
    it = iter(tb)
    first = [next(it)["x"] for _ in range(2)]
    state = tb.state_dict()
    rest = [b["x"] for b in it]
    assert torch.equal(torch.cat(first + rest), expected)
    assert state["yielded"] == 2
    other = TensorBatches({"x": x}, 3, shuffle=True)
    other.load_state_dict(state)
    torch.manual_seed(99)  # the continued pass uses its recorded order, not the generator
    assert [b["x"].tolist() for b in other] == [b.tolist() for b in rest]
    assert len(list(other)) == 4  # the next pass is a whole one


def test_a_child_forked_while_a_run_trains_does_not_hold_its_lock(tmp_path):
    """DataLoader workers are forked while train() holds the run's lock: were the lock
    theirs too, a resume after a crash would be refused while they linger."""
    import os
    import signal
    import time

    from nitro_core.store.claims import run_lock

    started, child_end = os.pipe()
    with run_lock(tmp_path, "r1") as mine:
        assert mine
        pid = os.fork()
        if pid == 0:  # the child: a worker that outlives its parent's lock
            os.write(child_end, b"x")  # fork() has returned here: its handlers ran
            time.sleep(30)
            os._exit(0)
        assert os.read(started, 1) == b"x"
    os.close(started)
    os.close(child_end)
    try:
        with run_lock(tmp_path, "r1") as again:
            assert again, "the forked child still holds the run's lock"
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


# -- SIGKILL at random moments, resume='auto' each time ------------------------------------
POINTS_WORKER = Path(__file__).parents[1] / "_points_worker.py"


@pytest.mark.slow
@pytest.mark.parametrize(
    "split",
    [
        "tensor",
        "plain",
        pytest.param("stateful2", marks=needs_torchdata),
    ],
)
def test_sigkilled_ten_times_and_resumed_each_time_equals_the_uninterrupted_run(
    tmp_path, split, monkeypatch
):
    import random
    import subprocess
    import sys
    import time

    from safetensors import safe_open

    from tests.nitro_core.store.test_reliability import Workers, manifest_problems

    class PointWorkers(Workers):
        def start(self, name, run_dir, *args):
            log = self.tmp_path / f"{name}.log"
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, str(POINTS_WORKER), str(run_dir), *map(str, args)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            self.procs.append(proc)
            self.logs[proc.pid] = log
            return proc

    from nitro_core.store.reclaim import record_like

    monkeypatch.setenv("NITRO_RECLAIM_AFTER_S", "0")  # each life reclaims what the last left
    workers = PointWorkers(tmp_path)
    try:
        rnd = random.Random(f"kills-{split}")
        out_a, out_b, run_b = tmp_path / "A.safetensors", tmp_path / "B.safetensors", tmp_path / "B"
        common = ("--split", split, "--slow-write", 0.25)
        run_a = workers.start("A", tmp_path / "A", *common, "--resume", "false", "--out", out_a)
        kills, mid_write, mid_epoch = 10, 0, 0

        def launch(i, *extra):
            hold, ready = tmp_path / f"hold-{i}", tmp_path / f"ready-{i}"
            args = (*common, "--hold", hold, "--ready", ready, *extra)
            return workers.start(f"B{i}", run_b, *args), hold, ready

        upcoming = [launch(0), launch(1)]  # import torch ahead, each held until its turn
        for i in range(kills):
            proc, hold, ready = upcoming.pop(0)
            hold.touch()  # only now may it touch the run directory: B{i-1} is dead
            workers.wait_ready(proc, ready, f"life {i}")
            started = time.time_ns()
            upcoming.append(launch(i + 2, *(("--out", out_b) if i + 2 == kills else ())))
            time.sleep(rnd.uniform(0.1, 1.0))  # ~2 points a life; 32 in all
            workers.kill(proc, f"life {i}")
            mid_write += any(p.stat().st_mtime_ns >= started for p in run_b.glob("*.tmp"))
            problems = manifest_problems(run_b)
            assert not problems, f"after SIGKILL {i}: " + "; ".join(problems)
            entries = read_manifest(run_b)
            mid_epoch += bool(entries) and entries[-1].batch is not None
        final, hold, _ = upcoming.pop(0)
        for proc, *_ in upcoming:
            proc.kill()
        hold.touch()
        workers.finish(final, "the last life")
        workers.finish(run_a, "run A (uninterrupted)")
        assert mid_write, f"none of {kills} kills landed during a record write"
        assert mid_epoch, f"no life of {kills} resumed from a mid-epoch record"

        with safe_open(str(out_a), "pt") as fa, safe_open(str(out_b), "pt") as fb:
            assert sorted(fa.keys()) == sorted(fb.keys())
            differ = [k for k in fa.keys() if not torch.equal(fa.get_tensor(k), fb.get_tensor(k))]
            assert not differ, f"these differ from the uninterrupted run: {differ}"
            assert fa.metadata() == fb.metadata()  # step, param groups, schedule, history
            assert len(json.loads(fa.metadata()["history"])) == 32  # 4 x (7 mid-epoch + 1 end)
        problems = manifest_problems(run_b)
        assert not problems, "; ".join(problems)
        assert {e.run for e in read_manifest(run_b)} == {read_manifest(run_b)[0].run}
        listed = {e.file for e in read_manifest(run_b)}  # no record a kill left stays (issue 34)
        leaked = [p.name for p in run_b.iterdir() if record_like(p.name) and p.name not in listed]
        assert not leaked, leaked
    finally:
        workers.close()
