"""The Slurm executor's pure rules, without a cluster: how each command's output is read
(the rows below are what Debian's sacct, squeue and scontrol print, copied from the local
cluster of ``slurm_local``), which states end an allocation, how a job ends when its worker
recorded no end (the TIMEOUT mapping among them), and the engine query rate limit (the
options' patterns and the sbatch command line: test_slurm_options.py). The real cluster runs in tests/nitro_mcp/test_slurm_executor.py."""

from __future__ import annotations

import pytest

from nitro_core.jobs import slurm
from nitro_core.jobs.cluster import ending


@pytest.mark.parametrize(
    ("out", "said"),
    [
        ("RUNNING|n1\n", ("RUNNING", "n1")),
        ("PENDING|None assigned\n", ("PENDING", "None assigned")),
        ("CANCELLED by 0|n[1-2]\n", ("CANCELLED", "n[1-2]")),
        ("TIMEOUT|n2\n", ("TIMEOUT", "n2")),
        ("COMPLETED|n1\nCOMPLETED|n1\n", ("COMPLETED", "n1")),
        ("", None),  # no accounting, or the job is not in the database yet
    ],
)
def test_sacct_rows_give_the_first_word_of_the_state(out, said):
    assert slurm.parse_sacct(out) == said


@pytest.mark.parametrize(
    ("out", "said"),
    [("RUNNING|n1\n", ("RUNNING", "n1")), ("PENDING|\n", ("PENDING", None)), ("", None)],
)
def test_squeue_rows_give_state_and_nodes(out, said):
    assert slurm.parse_squeue(out) == said


def test_scontrol_one_line_gives_state_and_nodes():
    out = ("JobId=7 JobName=nitro-a1 UserId=root(0) JobState=TIMEOUT Reason=TimeLimit "
           "RunTime=00:01:04 TimeLimit=00:01:00 NodeList=n1 BatchHost=n1\n")  # fmt: skip
    assert slurm.parse_scontrol(out) == ("TIMEOUT", "n1")
    pending = "JobId=8 JobState=PENDING Reason=Resources NodeList=(null)\n"
    assert slurm.parse_scontrol(pending) == ("PENDING", None)
    assert slurm.parse_scontrol("") is None


@pytest.mark.parametrize(
    ("state", "over"),
    [
        ("PENDING", False), ("CONFIGURING", False), ("RUNNING", False), ("COMPLETING", False),
        ("SUSPENDED", False), ("UNREACHABLE", False),  # no answer is not an end
        ("COMPLETED", True), ("CANCELLED", True), ("FAILED", True), ("NODE_FAIL", True),
        ("OUT_OF_MEMORY", True), ("BOOT_FAIL", True), ("TIMEOUT", True), ("PREEMPTED", True),
        (None, True),  # the controller knows the job no more
    ],
)  # fmt: skip
def test_which_slurm_states_end_the_allocation(state, over):
    assert slurm.gone(slurm.EngineState(state, "squeue", 0.0)) is over


RECORD = "ep0003-step000018.safetensors"


@pytest.mark.parametrize(
    ("word", "stop_requested", "last", "state", "text"),
    [
        ("CANCELLED", True, (RECORD, "requested"), "stopped", None),
        ("TIMEOUT", False, (RECORD, "budget"), "stopped", None),
        ("TIMEOUT", False, (RECORD, None), "lost", "Slurm job 12 ended (TIMEOUT, from sacct) "
         "without the worker recording a result: the allocation is gone (its time limit ran "
         f"out); its last committed record is {RECORD!r}."),
        ("TIMEOUT", False, None, "lost", "Slurm job 12 ended (TIMEOUT, from sacct) without the "
         "worker recording a result: the allocation is gone (its time limit ran out); it "
         "committed no record."),
        ("CANCELLED", False, (RECORD, "budget"), "lost", "Slurm job 12 ended (CANCELLED, from "
         "sacct) without the worker recording a result: the allocation is gone (cancelled from "
         f"outside, a node failed, or its time ran out); its last committed record is {RECORD!r}."),
        ("NODE_FAIL", False, (RECORD, None), "lost", None),
        ("FAILED", False, None, "lost", None),
    ],
)  # fmt: skip
def test_a_job_whose_allocation_is_gone_without_its_end(word, stop_requested, last, state, text):
    changes, event = ending(word, "sacct", "12", stop_requested, last)
    assert changes["state"] == state and event == state
    if text is not None:
        assert changes["error"] == text
    if word == "TIMEOUT" and state == "stopped":
        assert changes["result"] == {"stop_reason": "budget", "record": RECORD}


def test_the_engine_is_asked_at_most_once_per_second_per_job():
    asked: list[str] = []
    now = [1000.0]

    def ask(slurm_id):
        asked.append(slurm_id)
        return slurm.EngineState("RUNNING", "squeue", 0.0)

    engine = slurm.Engine(ask=ask, clock=lambda: now[0])
    for _ in range(60):  # sixty status calls, 19 ms apart
        assert engine.state("5").state == "RUNNING"
        now[0] += 0.019
    assert asked == ["5", "5"]  # at 1000.0 and at 1000.0 + 53 * 0.019 >= 1001.0
    engine.state("6")  # another job has its own second
    assert asked == ["5", "5", "6"] and engine.queries == 3
    now[0] += 1.0
    engine.state("5")
    engine.state("6")
    assert asked[3:] == ["5", "6"]
