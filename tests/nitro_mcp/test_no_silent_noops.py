"""No silent no-ops (issue 10, item 6): a second train job on a run directory a job already
trains is refused (or queued behind it when asked), a resume with nothing left to train is
refused before a job starts, and every hint after lost, stopped or failed is a complete
tool call with the job's own arguments."""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core import Nitro, read_manifest
from nitro_core.examples import Regression
from nitro_core.jobs.call_models import AverageCall, TrainCall, ValidateCall
from nitro_core.jobs.files import JobSpec, job_dir, read_spec, read_status, write_json
from nitro_mcp.server import build_server
from nitro_mcp.tool_calls import after_failure

from .conftest import call, wait_done

E = "Error executing tool nitro_train: "


def _jobs(root: Path) -> list[str]:
    store = root / ".nitro" / "jobs"
    return sorted(p.name for p in store.iterdir()) if store.exists() else []


def test_a_second_train_job_on_a_busy_run_dir_is_refused_naming_the_job(tmp_path):
    async def main():
        async with Client(build_server(tmp_path, max_jobs=0)) as client:  # jobs stay queued
            err, first = await call(
                client, "nitro_train", experiment="Regression", overrides={"samples": 64}
            )
            assert not err, first
            refused = await call(
                client, "nitro_train", experiment="Regression", resume="auto",
                overrides={"max_epochs": 4},
            )  # fmt: skip
            err, elsewhere = await call(
                client, "nitro_train", experiment="Regression", run_dir="runs/other"
            )
            assert not err, elsewhere  # another run directory is another matter
            return first["job_id"], refused

    job, (err, text) = anyio.run(main)
    assert err and text == E + (
        f"run_dir='runs/Regression' is already being trained by job {job} (queued); a second "
        f"job there would train beside it. Follow that job with nitro_status(job_id='{job}', "
        f"wait_s=25), stop it with nitro_stop(job_id='{job}'), or start this one when it ends: "
        "nitro_train(experiment='Regression', run_dir='runs/Regression', resume='auto', "
        "overrides={'max_epochs': 4}, after_running=true)."
    )
    assert len(_jobs(tmp_path)) == 2  # the refused call created none


@pytest.mark.slow  # a real worker end to end; `pytest -m slow`
def test_after_running_queues_the_job_until_the_one_training_its_run_dir_ends(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:  # two slots: one stays free
            err, first = await call(
                client, "nitro_train", experiment="Regression",
                overrides={"samples": 256, "max_epochs": 2},
            )  # fmt: skip
            assert not err, first
            err, second = await call(
                client, "nitro_train", experiment="Regression", resume="auto",
                overrides={"max_epochs": 3}, after_running=True,
            )  # fmt: skip
            assert not err, second
            assert second["state"] == "queued" and second["next"].startswith(
                f"It starts when job {first['job_id']} ends. "
            )
            one = await wait_done(client, first["job_id"])
            two = await wait_done(client, second["job_id"])
            return one, two

    one, two = anyio.run(main)
    assert one["state"] == two["state"] == "succeeded", (one, two)
    assert two["result"]["run_id"] == one["result"]["run_id"] and two["epoch"] == 3
    first, second = (job_dir(tmp_path, j["job_id"]) for j in (one, two))
    assert read_spec(second).after == one["job_id"]
    assert read_status(second).started >= read_status(first).ended


@pytest.mark.slow  # a real worker end to end; `pytest -m slow`
def test_a_queued_resume_that_finds_nothing_left_to_train_fails_with_the_call_to_send(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            err, first = await call(
                client, "nitro_train", experiment="Regression",
                overrides={"samples": 64, "max_epochs": 1},
            )  # fmt: skip
            err, second = await call(
                client, "nitro_train", experiment="Regression", resume="auto", after_running=True
            )
            assert not err, second
            one = await wait_done(client, first["job_id"])
            return one, await wait_done(client, second["job_id"])

    one, two = anyio.run(main)
    run = one["result"]["run_id"]
    assert two["state"] == "failed" and two["error"] == (
        f"resume='auto' has nothing to train: run {run} reached epoch 1, and max_epochs is 1. "
        "To train further, pass a larger max_epochs, e.g. overrides={'max_epochs': 2}: "
        "nitro_train(experiment='Regression', run_dir='runs/Regression', resume='auto', "
        "overrides={'max_epochs': 2})."
    )


@pytest.mark.parametrize("resume", ["auto", "{run} => latest"])
def test_a_resume_with_nothing_left_to_train_is_refused_before_a_job_starts(tmp_path, resume):
    Nitro(Regression(max_epochs=1, samples=64), run_dir=tmp_path / "runs/Regression").train()
    run = read_manifest(tmp_path / "runs/Regression")[-1].run
    resume = resume.format(run=run)

    async def main():
        async with Client(build_server(tmp_path, max_jobs=0)) as client:
            return await call(client, "nitro_train", experiment="Regression", resume=resume)

    err, text = anyio.run(main)
    assert err and text == E + (
        f"resume='{resume}' has nothing to train: run {run} reached epoch 1, and max_epochs is "
        "1. To train further, pass a larger max_epochs, e.g. overrides={'max_epochs': 2}: "
        f"nitro_train(experiment='Regression', run_dir='runs/Regression', resume='{resume}', "
        "overrides={'max_epochs': 2})."
    )
    assert _jobs(tmp_path) == []


def test_the_hints_after_stopped_and_lost_are_complete_calls(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()

    async def main():
        async with Client(build_server(tmp_path, max_jobs=0)) as client:
            err, a = await call(
                client, "nitro_train", experiment="Regression", overrides={"samples": 64}
            )
            err, stopped = await call(client, "nitro_stop", job_id=a["job_id"])
            assert not err and stopped["state"] == "stopped", stopped
            err, stopped = await call(client, "nitro_status", job_id=a["job_id"])
            err, b = await call(
                client, "nitro_train", experiment="Regression", overrides={"samples": 64},
                device="cpu",
            )  # fmt: skip
            where = job_dir(tmp_path, b["job_id"])  # as a worker that died mid-training left it
            write_json(
                where / "status.json",
                read_status(where).model_copy(
                    update={"state": "running", "phase": "training", "pid": dead.pid,
                            "run_id": "0badc0de", "started": "2026-01-01T00:00:00Z"}
                ),
            )  # fmt: skip
            err, lost = await call(client, "nitro_status", job_id=b["job_id"])
            return stopped, lost

    stopped, lost = anyio.run(main)
    again = (
        "nitro_train(experiment='Regression', run_dir='runs/Regression', overrides={'samples': 64})"
    )
    assert (
        stopped["hint"]
        == stopped["next"]
        == (f"Nothing was done; to run it after all, call again: {again}.")
    )
    assert lost["state"] == "lost" and lost["hint"] == lost["next"] == (
        "The run stays resumable: nitro_train(experiment='Regression', "
        "run_dir='runs/Regression', resume='auto', overrides={'samples': 64}, device='cpu') "
        "continues it."
    )


def test_the_hint_after_a_diverged_run_is_a_complete_call_from_its_last_record(
    tmp_path, monkeypatch
):
    repo = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", repo)  # the worker imports the operator's module by name

    async def main():
        modules = ("tests.nitro_mcp.diverging",)
        async with Client(build_server(tmp_path, experiment_modules=modules)) as client:
            err, job = await call(
                client, "nitro_train", experiment="Diverging", overrides={"max_epochs": 3}
            )
            assert not err, job
            return await wait_done(client, job["job_id"])

    failed = anyio.run(main)
    assert failed["state"] == "failed" and failed["error"].startswith(
        "The training loss became non-finite at epoch 2"
    )
    assert (
        failed["hint"]
        == failed["next"]
        == (
            "Lower the learning rate, or fix the data or the metric. A resume keeps the run's "
            "recorded config, so change it in a new run from the last good record: "
            "nitro_train(experiment='Diverging', run_dir='runs/Diverging', "
            f"weights='{failed['run_id']} => latest', overrides={{'max_epochs': 3}}), with the "
            "changed fields in overrides."
        )
    )


SPEC = {"job_id": "j", "created": "2026-01-01T00:00:00Z"}
RUN_DIR = "/r/runs/x"
TRAIN = JobSpec(kind="train", call=TrainCall(experiment="Classifier", run_dir=RUN_DIR,
                                             overrides={"samples": 12000}), **SPEC)  # fmt: skip
VALIDATE = JobSpec(kind="validate", call=ValidateCall(experiment="Classifier", run_dir=RUN_DIR,
                                                      weights="latest => best"), **SPEC)  # fmt: skip
AVERAGE = JobSpec(
    kind="average", call=AverageCall(run_dir=RUN_DIR, source="latest => Average(Last(3))",
                                     validate_average=True, experiment="C"), **SPEC,
)  # fmt: skip

AFTER_FAILURE = [
    (TRAIN, "diverged", None,
     "Lower the learning rate, or fix the data or the metric, then start again: "
     "nitro_train(experiment='Classifier', run_dir='runs/x', overrides={'samples': 12000}), "
     "with the changed fields in overrides."),
    (TRAIN, "corrupt", "a1b2c3d4",
     "Pick another checkpoint (nitro_manifest(run_dir='runs/x') lists them), then call again: "
     "nitro_train(experiment='Classifier', run_dir='runs/x', overrides={'samples': 12000})."),
    (TRAIN, "unexpected", "a1b2c3d4",
     "An unexpected error: the log tail holds the traceback. The run stays resumable: "
     "nitro_train(experiment='Classifier', run_dir='runs/x', resume='auto', "
     "overrides={'samples': 12000})."),
    (VALIDATE, "refused", None,
     "The error says what to write instead; then call again: nitro_validate("
     "experiment='Classifier', run_dir='runs/x', weights='latest => best')."),
    (AVERAGE, "unexpected", None,
     "An unexpected error: the log tail holds the traceback. Call again: average("
     "run_dir='runs/x', source='latest => Average(Last(3))', experiment='C', validate=true)."),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "failure", "run", "hint"), AFTER_FAILURE)
def test_every_hint_after_a_failure_is_a_complete_call_in_the_jobs_arguments(
    spec, failure, run, hint
):
    assert after_failure(spec, Path("/r"), failure, run) == hint
