"""Validation and averaging are not stuck behind training: evaluation jobs have slots of
their own (``max_eval_jobs``, ``nitro serve --max-eval-jobs``) beside the ``max_jobs``
trainings, so ``nitro_validate`` answers within its wait while two trainings run."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core import Nitro
from nitro_core.examples import Regression
from nitro_core.jobs import JobManager
from nitro_core.jobs import local as local_module
from nitro_core.jobs.call_models import AverageCall, TrainCall, ValidateCall
from nitro_core.jobs.files import read_spec, read_status
from nitro_mcp.cli import _parser
from nitro_mcp.server import build_server

from .conftest import call, ended

SMALL = {"max_epochs": 1, "samples": 64}


class Worker:
    """Stands in for a worker process that keeps running."""

    def __init__(self, args, **kwargs):
        self.pid = 4_100_000

    def poll(self):
        return None


def test_evaluations_take_their_own_slots_beside_trainings(tmp_path, monkeypatch):
    monkeypatch.setattr(local_module.subprocess, "Popen", Worker)
    monkeypatch.setattr(local_module, "alive", lambda pid, start: True)
    jobs = JobManager(tmp_path, max_jobs=1, max_eval_jobs=1)
    run = str(tmp_path / "runs/r")
    train = [jobs.submit(TrainCall(experiment="Regression", run_dir=run)) for _ in range(2)]
    evals = [
        jobs.submit(ValidateCall(experiment="Regression", run_dir=run)),
        jobs.submit(AverageCall(run_dir=run, source="latest => Average(Last(2))")),
    ]
    states = {s.job_id: read_status(jobs.jobs_dir / s.job_id).state for s in train + evals}
    assert [states[s.job_id] for s in train] == ["running", "queued"]
    assert [states[s.job_id] for s in evals] == ["running", "queued"]  # not behind training
    assert read_spec(jobs.jobs_dir / evals[0].job_id).max_eval_jobs == 1  # for the worker's pump


def test_serve_takes_max_eval_jobs():
    args = _parser().parse_args(["serve", "--max-jobs", "1", "--max-eval-jobs", "3"])
    assert (args.max_jobs, args.max_eval_jobs) == (1, 3)
    assert _parser().parse_args(["serve"]).max_eval_jobs == 2


@pytest.mark.slow  # a real worker end to end; `pytest -m slow`
def test_validate_answers_within_its_wait_while_two_trainings_run(tmp_path, monkeypatch):
    Nitro(Regression(**SMALL), run_dir=tmp_path / "runs/Regression").train()
    repo = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", repo)  # the worker imports the test module by name
    server = build_server(
        tmp_path, max_jobs=2, experiment_modules=("tests.nitro_mcp.slow_experiment",)
    )

    async def main():
        async with Client(server) as client:
            long = {"max_epochs": 1000, "step_s": 0.05}  # sleeps: long, and leaves the CPU
            trainings = []
            for name in ("a", "b"):
                err, job = await call(
                    client, "nitro_train", experiment="SlowSteps", run_dir=f"runs/{name}",
                    overrides=long,
                )  # fmt: skip
                assert not err and job["state"] == "running", job
                trainings.append(job["job_id"])
            try:
                # the trainings run 1000 epochs: queued behind them, the validation never ends
                reply = await call(
                    client, "nitro_validate", experiment="Regression", overrides=SMALL, wait_s=45
                )
                err, val = await ended(client, reply)  # a loaded machine: follow it to its end
                assert not err and val["state"] == "succeeded", val
                assert set(val["metrics"]) == {"loss"}
                for job_id in trainings:  # still training: the validation did not wait for them
                    err, status = await call(client, "nitro_status", job_id=job_id, brief=True)
                    assert status["state"] == "running", status
            finally:
                for job_id in trainings:
                    await call(client, "nitro_stop", job_id=job_id, force=True)

    anyio.run(main)
