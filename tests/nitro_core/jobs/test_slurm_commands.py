"""The Slurm commands Nitro runs and how it reads their answers, with ``_run`` replaced in
this process (no cluster, no subprocess): sinfo's partitions, the check before a job is
submitted, scancel's arguments, and a controller no command reaches."""

from __future__ import annotations

import subprocess

import pytest
from pydantic import ValidationError

from nitro_core import ConfigError
from nitro_core.jobs import cluster, slurm
from nitro_core.jobs.call_models import SLURM_GRES, SLURM_NAME, SlurmOptions, TrainCall
from nitro_core.jobs.files import JobStatus, job_dir, read_status, write_json


def _answers(monkeypatch, outputs: dict[str, tuple[int, str, str] | BaseException]) -> list:
    """Replace ``slurm._run``: each command (by its first word) answers (code, out, err) or
    raises; returns the list of argv it was called with."""
    calls: list[list[str]] = []

    def run(argv, timeout=20):
        calls.append(list(argv))
        said = outputs[argv[0]]
        if isinstance(said, BaseException):
            raise said
        code, out, err = said
        return subprocess.CompletedProcess(argv, code, out, err)

    monkeypatch.setattr(slurm, "_run", run)
    return calls


SINFO = "debug* 2\ncpu 4\ndebug* 3\ncpu 1\ngpu 2\n"  # one line per partition and node state


def test_sinfo_lines_of_one_partition_add_up_and_the_starred_one_is_the_default(monkeypatch):
    _answers(monkeypatch, {"sinfo": (0, SINFO, "")})
    assert slurm._partitions() == {"debug": (5, True), "cpu": (5, False), "gpu": (2, False)}


def test_sinfo_that_fails_or_is_missing_lists_no_partition(monkeypatch):
    _answers(monkeypatch, {"sinfo": (1, SINFO, "slurm_load_partitions: error")})
    assert slurm._partitions() == {}
    _answers(monkeypatch, {"sinfo": FileNotFoundError("sinfo")})
    assert slurm._partitions() == {}


def _submittable(monkeypatch, **call) -> None:
    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    _answers(monkeypatch, {"sinfo": (0, SINFO, "")})
    slurm.check_submittable(TrainCall(experiment="Regression", executor="slurm", **call))


def test_a_job_may_ask_for_every_node_of_its_partition_and_no_more(monkeypatch):
    _submittable(monkeypatch, nodes=5)  # the default partition, debug: 2 + 3 nodes
    _submittable(monkeypatch, nodes=2, slurm={"partition": "gpu"})
    with pytest.raises(ConfigError) as caught:
        _submittable(monkeypatch, nodes=6)
    assert str(caught.value) == (
        "nodes=6 is more nodes than partition 'debug' has (5). Send nodes from 1 to 5, e.g. "
        "nodes=5."
    )
    with pytest.raises(ConfigError, match=r"nodes=3 is more nodes than partition 'gpu' has \(2\)"):
        _submittable(monkeypatch, nodes=3, slurm={"partition": "gpu"})


def test_an_unknown_partition_is_refused_naming_the_cluster_s(monkeypatch):
    with pytest.raises(ConfigError) as caught:
        _submittable(monkeypatch, slurm={"partition": "big"})
    assert str(caught.value) == (
        "slurm partition 'big' is not one of this cluster's: cpu, debug, gpu. Send "
        "slurm={'partition': 'cpu'} (sinfo lists them)."
    )


def test_a_forced_cancel_kills_every_process_and_a_plain_one_asks(monkeypatch):
    calls = _answers(monkeypatch, {"scancel": (0, "", "")})
    slurm.cancel("42", force=True)
    slurm.cancel("43", force=False)
    slurm.cancel_pending("44")
    assert calls == [
        ["scancel", "--full", "--signal=KILL", "42"],
        ["scancel", "43"],
        ["scancel", "--state=PENDING", "44"],
    ]


def test_a_controller_no_command_reaches_is_unreachable_not_an_ended_job(monkeypatch):
    down = subprocess.TimeoutExpired("sacct", 20)
    _answers(monkeypatch, {"sacct": down, "squeue": down, "scontrol": OSError("no route")})
    said = slurm.query("7")
    assert (said.state, said.source) == ("UNREACHABLE", "scontrol")
    assert not slurm.gone(said)
    refused = (1, "", "slurm_load_jobs error: Unable to contact slurm controller")
    _answers(monkeypatch, {"sacct": (1, "", ""), "squeue": refused, "scontrol": refused})
    assert slurm.query("7").state == "UNREACHABLE"


def test_a_job_the_controller_does_not_know_is_gone(monkeypatch):
    unknown = (1, "", "slurm_load_jobs error: Invalid job id specified")
    _answers(monkeypatch, {"sacct": (0, "", ""), "squeue": unknown, "scontrol": unknown})
    said = slurm.query("7")
    assert said.state is None and slurm.gone(said)
    _answers(monkeypatch, {"sacct": (0, "", ""), "squeue": (0, "", ""), "scontrol": unknown})
    assert slurm.query("7").state is None  # squeue answered, with no row


def _running(tmp_path) -> tuple:
    """A Slurm job whose worker started and recorded no end: its directory and status."""
    directory = job_dir(tmp_path, "j1")
    directory.mkdir(parents=True)
    status = JobStatus(
        job_id="j1", kind="train", state="running", phase="training", executor="slurm",
        slurm_id="7", run_dir=str(tmp_path / "runs" / "x"), created="t",
    )  # fmt: skip
    write_json(directory / "status.json", status)
    return directory, status


def test_a_running_job_the_controller_knows_no_more_is_lost_saying_so(tmp_path, monkeypatch):
    unknown = (1, "", "slurm_load_jobs error: Invalid job id specified")
    _answers(monkeypatch, {"sacct": (0, "", ""), "squeue": unknown, "scontrol": unknown})
    directory, status = _running(tmp_path)
    done = cluster.refresh(directory, status, slurm.Engine())
    assert (done.state, done.phase) == ("lost", "lost")
    assert done.error == (
        "Slurm job 7 ended (unknown to the scheduler, from scontrol) without the worker "
        "recording a result: the allocation is gone (cancelled from outside, a node failed, or "
        "its time ran out); it committed no record."
    )
    assert done.engine is not None and done.engine.state is None
    assert read_status(directory) == done


def test_a_controller_that_does_not_answer_leaves_the_job_running(tmp_path, monkeypatch):
    refused = (1, "", "slurm_load_jobs error: Unable to contact slurm controller")
    _answers(monkeypatch, {"sacct": (1, "", ""), "squeue": refused, "scontrol": refused})
    directory, status = _running(tmp_path)
    said = cluster.refresh(directory, status, slurm.Engine())
    assert (said.state, said.error) == ("running", None)
    assert said.engine is not None and said.engine.state == "UNREACHABLE"


@pytest.mark.parametrize(
    "field, value",
    [("partition", "--exclusive"), ("account", "-A"), ("qos", "-normal"), ("gres", "-gpu:4"),
     ("partition", "."), ("account", ",a")],
)  # fmt: skip
def test_an_option_value_that_starts_with_a_dash_or_a_separator_is_refused(field, value):
    pattern = SLURM_GRES if field == "gres" else SLURM_NAME
    sample = {"partition": "debug", "account": "research", "qos": "normal", "gres": "gpu:4"}
    with pytest.raises(ValidationError) as caught:
        SlurmOptions(**{field: value})
    assert (
        f"slurm.{field}={value!r} is not a Slurm {field}: it must match {pattern} (no space, "
        "control character, quote or shell character, no leading '-'). Send e.g. "
        f"slurm={{'{field}': '{sample[field]}'}}."
    ) in str(caught.value)
    assert SlurmOptions(**{field: "a" + value}).model_dump()[field] == "a" + value
