"""Two ranks on gloo, in the default suite: one ``torchrun`` launch (``phases_script.py``)
trains under DDP and FSDP, stops mid-epoch on one rank's request, resumes, and fails a
write on rank 0; the tests read what each rank said. The slower multi-process tests are in
``test_ddp.py`` and ``test_fsdp.py`` (``-m slow``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from nitro_core import read_manifest
from nitro_core.store import recordio as store
from tests.nitro_core.distributed.conftest import assert_equal_tensors, tensors, torchrun

PHASES = Path(__file__).with_name("phases_script.py")
STRATEGIES = ["ddp", "fsdp"]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("two-ranks")
    torchrun(2, out, script=PHASES, timeout=400)  # generous: a loaded 2-core machine
    return out


def said(out: Path, strategy: str) -> list[dict[str, Any]]:
    """Each rank's report for ``strategy``, in rank order."""
    return [json.loads((out / f"rank{r}.json").read_text())[strategy] for r in (0, 1)]


def rows(history: list[dict[str, Any]], drop: tuple[str, ...] = ("seconds",)) -> list[Any]:
    """History or log rows without what may differ between two runs (wall time)."""
    return [{k: v for k, v in row.items() if k not in drop} for row in history]


def log_rows(run_dir: Path) -> list[dict[str, Any]]:
    (log,) = (run_dir / "logs").glob("*.jsonl")
    return rows(
        [json.loads(line) for line in log.read_text().splitlines()], drop=("run", "seconds")
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_stop_asked_on_one_rank_stops_every_rank_at_the_next_point(
    ran: Path, strategy: str
) -> None:
    # rank 1 alone asked at the end of epoch 1: both stopped at the next point, mid-epoch
    for rank, s in enumerate(said(ran, strategy)):
        assert (s["b"]["at"], s["b"]["stop"]) == ([2, 1, 6], "requested"), rank
    stops = [
        (e.epoch, e.batch, e.step) for e in read_manifest(ran / strategy / "b") if e.stop_reason
    ]
    assert stops == [(2, 1, 6), (2, None, 10)]  # B's stop, then C's end


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_train_returns_on_every_rank_once_rank_0_committed_the_last_record(
    ran: Path, strategy: str
) -> None:
    # rank 0 commits every record; rank 1's train() must not return before that commit (a
    # resume there would start from the record before it, out of step with rank 0)
    for rank, s in enumerate(said(ran, strategy)):
        assert s["b"]["listed"] == [2, 1, 6], rank


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_mid_epoch_stop_and_resume_logs_and_ends_as_the_uninterrupted_run(
    ran: Path, strategy: str
) -> None:
    out = ran / strategy
    reports = said(ran, strategy)
    for rank, s in enumerate(reports):
        # A == B + C: every field of every history row (JSON floats read back exactly)
        assert rows(s["c"]) == rows(s["a"]), rank
        assert_equal_tensors(
            tensors(out / f"a-rank{rank}.safetensors"), tensors(out / f"c-rank{rank}.safetensors")
        )
    assert rows(reports[1]["c"]) == rows(reports[0]["c"])  # the ranks log the same rows
    assert log_rows(out / "b") == log_rows(out / "a")  # rank 0's log of the run, line by line
    entries = {(e.epoch, e.batch): e for e in read_manifest(out / "b")}
    assert rows(store.read_header(out / "b" / entries[2, None].file)["history"]) == rows(
        reports[0]["a"]
    )
    # the mid-epoch record holds each rank's own running loss sum and data position (they
    # differ: the test's ranks draw differently), which the resumed rows are computed from
    record, meta = store.read_record(out / "b" / entries[2, 1].file)
    (other,) = meta["ranks"]["states"]
    assert other["loss_sum"] != meta["position"]["loss_sum"]
    assert not torch.equal(record["rng/rank1/data/order_rng"], record["rng/data/order_rng"])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_write_failing_on_rank_0_stops_every_rank_at_the_next_point_in_its_words(
    ran: Path, strategy: str
) -> None:
    # rank 0's second write (at step 4) failed in the background; at the next point, the
    # epoch's end, rank 0 raises it and rank 1, which wrote nothing, says why it stops
    rank0, rank1 = (s["d"] for s in said(ran, strategy))
    assert rank0 == "OSError: [Errno 5] Input/output error (injected)"
    assert rank1 == (
        "TrainingRefused: Rank 0's checkpoint write failed (OSError: [Errno 5] Input/output "
        "error (injected)); every rank stops here. The records listed in the manifest are "
        "intact: fix the cause, then continue with resume='auto'."
    )
    assert [(e.epoch, e.batch, e.step) for e in read_manifest(ran / strategy / "d")] == [(1, 2, 2)]
