"""The MCP server through a real client, in-process in both connection modes."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core import read_manifest
from nitro_core.jobs.call_models import TrainCall
from nitro_mcp.server import build_server

from .conftest import FAST, call, ended, wait_done

TOOLS = {
    "nitro_train", "nitro_validate", "average", "nitro_status", "nitro_jobs", "nitro_stop",
    "nitro_runs", "nitro_manifest", "nitro_checkpoint_info", "nitro_experiments",
    "nitro_history", "nitro_plot", "nitro_compare", "nitro_delete", "nitro_export",
    "nitro_verify",
}  # fmt: skip
IMAGE_ONLY = {"nitro_plot"}  # image content, no structured output (clients show the image)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_every_tool_is_listed_with_input_and_output_schemas(tmp_path, mode):
    async def main():
        async with Client(build_server(tmp_path), mode=mode) as client:
            tools = (await client.list_tools()).tools
            assert {t.name for t in tools} == TOOLS
            for t in tools:
                if t.name in IMAGE_ONLY:
                    assert t.output_schema is None, t.name
                else:
                    assert t.output_schema and t.output_schema["type"] == "object", t.name
                assert t.description and len(t.description) > 40, t.name
                for prop, schema in t.input_schema["properties"].items():
                    assert schema.get("description"), (t.name, prop)
            err, exps = await call(client, "nitro_experiments")
            assert not err
            by_name = {e["name"]: e for e in exps["experiments"]}
            assert set(by_name) == {"CausalLM", "Classifier", "HFCausalLM", "Regression"}
            fields = {f["name"]: f for f in by_name["Classifier"]["fields"]}
            assert fields["max_epochs"] == {
                "name": "max_epochs",
                "type": "int",
                "default": 6,
                "host": True,
            }
            assert fields["hidden"]["host"] is False
            assert by_name["Classifier"]["splits"] == ["test", "train", "val"]
            assert by_name["Classifier"]["monitor"] == ["acc", "max"]
            assert by_name["Regression"]["monitor"] == ["loss", "min"]

    anyio.run(main)


@pytest.mark.parametrize("mode", ["auto", pytest.param("legacy", marks=pytest.mark.slow)])
def test_train_status_validate_and_average_through_the_client(trained_root, mode):
    root, trained = trained_root

    async def main():
        async with Client(build_server(root), mode=mode) as client:
            err, status = await call(client, "nitro_status", job_id=trained["job_id"])
            assert not err and status["state"] == "succeeded" and status["epoch"] == 3
            assert status["result"]["stop_reason"] == "completed"
            assert [k["epoch"] for k in status["kept"]] == [
                e.epoch for e in read_manifest(root / "runs/Classifier")
            ]
            assert len(status["log_tail"]) <= 3000 and status["elapsed_s"] > 0
            err, val = await ended(client, await call(
                client, "nitro_validate", experiment="Classifier", weights="latest => best",
                overrides=FAST,
            ), root)  # fmt: skip
            assert not err and val["state"] == "succeeded", val
            assert set(val["metrics"]) == {"acc", "loss"} and val["checkpoint"].startswith(
                "runs/Classifier/epoch-"
            )
            err, avg = await ended(client, await call(client, "average", run_dir="runs/Classifier",
                                  source="latest => Average(Last(2))", experiment="Classifier", validate=True))  # fmt: skip
            assert not err and avg["state"] == "succeeded", avg
            assert avg["averaged_from"]["epochs"] == [2, 3] and set(avg["metrics"]) == {
                "acc",
                "loss",
            }

    anyio.run(main)


def test_runs_manifest_and_checkpoint_info_read_files_only(trained_root):
    root, trained = trained_root

    async def main():
        async with Client(build_server(root)) as client:
            err, runs = await call(client, "nitro_runs", run_dir="runs/Classifier")
            assert not err
            (run,) = [r for r in runs["runs"] if r["run"] == trained["run_id"]]
            assert run["metric"] == "acc" and run["stop_reason"] == "completed"
            err, page = await call(client, "nitro_manifest", run_dir="runs/Classifier", limit=1)
            assert (
                not err
                and page["total"] >= 2
                and len(page["entries"]) == 1
                and page["next_cursor"] == "1"
            )
            err, rest = await call(
                client, "nitro_manifest", run_dir="runs/Classifier", limit=50, cursor="1"
            )
            assert (
                not err
                and rest["next_cursor"] is None
                and len(rest["entries"]) == page["total"] - 1
            )
            path = f"runs/Classifier/{page['entries'][0]['file']}"
            err, info = await call(client, "nitro_checkpoint_info", path=path)
            assert not err and info["header"]["run"] == trained["run_id"]
            assert (
                info["header"]["rng"].startswith("(omitted")
                and "params" in info["header"]["layout"]
            )
            assert len(json.dumps(info)) < 20_000

    anyio.run(main)


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_status_long_polls_and_sends_progress_notifications(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            err, job = await call(
                client,
                "nitro_train",
                experiment="Regression",
                overrides={"max_epochs": 4, "samples": 256},
            )
            assert not err and job["state"] in ("queued", "running") and job["poll_after_s"] > 0
            seen = []

            async def on_progress(progress, total, message):
                seen.append((progress, total, message))

            with anyio.fail_after(120):
                while True:
                    result = await client.call_tool(
                        "nitro_status",
                        {"job_id": job["job_id"], "wait_s": 25},
                        progress_callback=on_progress,
                    )
                    if result.structured_content["state"] not in ("queued", "running"):
                        break
            assert result.structured_content["state"] == "succeeded"
            assert any(total == 4.0 and "epoch" in message for _, total, message in seen), seen

    anyio.run(main)


@pytest.mark.slow  # a real worker end to end; `pytest -m slow`
def test_graceful_stop_finishes_the_epoch_and_force_kill_leaves_the_run_resumable(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            slow = {"max_epochs": 50, "samples": 8192}
            err, job = await call(client, "nitro_train", experiment="Regression", overrides=slow)
            with anyio.fail_after(60):
                while (await call(client, "nitro_status", job_id=job["job_id"], wait_s=5))[1][
                    "epoch"
                ] < 1:
                    pass
            err, stopped = await call(client, "nitro_stop", job_id=job["job_id"])
            assert not err and "finishes, validates and checkpoints" in stopped["next"]
            final = await wait_done(client, job["job_id"])
            assert final["state"] == "stopped" and final["result"]["stop_reason"] == "requested"
            assert read_manifest(tmp_path / "runs/Regression")[-1].stop_reason == "requested"

            err, job2 = await call(
                client, "nitro_train", experiment="Regression", overrides=slow, resume="auto"
            )
            with anyio.fail_after(60):
                while (await call(client, "nitro_status", job_id=job2["job_id"], wait_s=5))[1][
                    "epoch"
                ] <= final["epoch"]:
                    pass
            err, killed = await call(client, "nitro_stop", job_id=job2["job_id"], force=True)
            assert not err and killed["state"] == "stopped" and killed["phase"] == "killed"
            reached = read_manifest(tmp_path / "runs/Regression")[-1].epoch  # where the kill landed
            err, job3 = await call(
                client,
                "nitro_train",
                experiment="Regression",
                overrides={**slow, "max_epochs": reached + 2},  # a resume with epochs left
                resume="auto",
            )
            done = await wait_done(client, job3["job_id"])
            assert done["state"] == "succeeded" and done["result"]["run_id"] == final["run_id"]

    anyio.run(main)


@pytest.mark.slow  # a real worker end to end; `pytest -m slow`
def test_a_restarted_server_reports_earlier_jobs_and_a_vanished_worker_as_lost(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as first:
            err, job = await call(
                first,
                "nitro_train",
                experiment="Regression",
                overrides={"max_epochs": 50, "samples": 8192},
            )
            with anyio.fail_after(60):
                while (await call(first, "nitro_status", job_id=job["job_id"], wait_s=5))[1][
                    "epoch"
                ] < 1:
                    pass
        pid = json.loads((tmp_path / ".nitro/jobs" / job["job_id"] / "status.json").read_text())[
            "pid"
        ]
        async with Client(
            build_server(tmp_path)
        ) as second:  # a new server process would see the same
            err, status = await call(second, "nitro_status", job_id=job["job_id"])
            assert (
                status["state"] == "running" and status["epoch"] >= 1
            )  # survived the first client
            os.kill(pid, signal.SIGKILL)
            with anyio.fail_after(10):
                while (await call(second, "nitro_status", job_id=job["job_id"]))[1][
                    "state"
                ] == "running":
                    await anyio.sleep(0.1)
            err, status = await call(second, "nitro_status", job_id=job["job_id"])
            assert (
                status["state"] == "lost" and "ended without recording a result" in status["error"]
            )
            assert "resume='auto'" in status["hint"] and "epoch 1 step" in status["log_tail"]
            err, jobs = await call(second, "nitro_jobs", state="lost")
            assert [j["job_id"] for j in jobs["jobs"]] == [job["job_id"]]
            reached = read_manifest(tmp_path / "runs/Regression")[-1].epoch  # where the kill landed
            err, again = await call(
                second,
                "nitro_train",
                experiment="Regression",
                overrides={"max_epochs": reached + 1, "samples": 8192},  # epochs left to train
                resume="auto",
            )
            assert not err, again
            done = await wait_done(second, again["job_id"])
            assert done["state"] == "succeeded" and done["result"]["run_id"] == status["run_id"]

    anyio.run(main)


@pytest.mark.slow  # a real worker end to end; `pytest -m slow`
def test_jobs_beyond_max_jobs_are_queued_and_started_later(tmp_path):
    async def main():
        async with Client(build_server(tmp_path, max_jobs=1)) as client:
            err, a = await call(
                client, "nitro_train", experiment="Regression", run_dir="runs/a", overrides=FAST
            )
            err, b = await call(
                client, "nitro_train", experiment="Regression", run_dir="runs/b", overrides=FAST
            )
            assert a["state"] == "running" and b["state"] == "queued"
            err, queued = await call(client, "nitro_jobs", state="queued")
            assert [j["job_id"] for j in queued["jobs"]] == [b["job_id"]]
            assert (await wait_done(client, a["job_id"]))["state"] == "succeeded"
            assert (await wait_done(client, b["job_id"]))["state"] == "succeeded"

    anyio.run(main)


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_nitro_train_replies_before_the_worker_imports_torch(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            started = time.perf_counter()
            err, job = await call(client, "nitro_train", experiment="Regression", overrides=FAST)
            elapsed = time.perf_counter() - started
            status = json.loads(
                (tmp_path / ".nitro/jobs" / job["job_id"] / "status.json").read_text()
            )
            assert status["phase"] == "starting"  # the worker has not reached setup yet
            await wait_done(client, job["job_id"])
            return elapsed

    assert anyio.run(main) < 2.0  # generous on a loaded CI machine; the benchmark measures it


def test_stopping_a_job_before_training_starts_reports_stopped(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            err, job = await call(client, "nitro_train", experiment="Regression", overrides=FAST)
            err, stopped = await call(
                client, "nitro_stop", job_id=job["job_id"]
            )  # while it imports torch
            assert not err, stopped
            final = await wait_done(client, job["job_id"])
            assert final["state"] == "stopped", final
            assert final["phase"] in ("cancelled", "done")  # done: SIGTERM landed after setup
            err, again = await call(client, "nitro_stop", job_id=job["job_id"])
            assert err and again.endswith(
                f"Job {job['job_id']} already ended (stopped); there is nothing to stop. nitro_status shows its result."
            )

    anyio.run(main)


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_two_servers_over_one_root_launch_a_queued_job_once(tmp_path):
    from nitro_core.jobs import JobManager

    first, second = JobManager(tmp_path, max_jobs=0), JobManager(tmp_path, max_jobs=0)
    job = first.submit(
        TrainCall(experiment="Regression", run_dir=str(tmp_path / "runs/r"), overrides=FAST)
    )
    assert job.state == "queued"
    first.max_jobs = second.max_jobs = 1
    first.local.launch(job.job_id)
    second.local.launch(job.job_id)  # lost the claim: must not start a second worker
    events = (tmp_path / ".nitro/jobs" / job.job_id / "events.jsonl").read_text()
    assert len(first.local._children) == 1 and len(second.local._children) == 0
    deadline = time.monotonic() + 120
    while first.status(job.job_id).state == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.status(job.job_id).state == "succeeded" and events.count("queued") == 1


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_a_nan_validation_metric_is_reported_not_fatal(tmp_path, monkeypatch):
    repo = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", repo)  # the worker imports the operator's module by name

    async def main():
        async with Client(
            build_server(tmp_path, experiment_modules=("tests.nitro_mcp.nan_experiment",))
        ) as client:
            err, job = await call(
                client, "nitro_train", experiment="NanMetric", overrides={"max_epochs": 2}
            )
            assert not err, job
            status = await wait_done(client, job["job_id"])
            assert status["state"] == "succeeded", status
            assert status["last_val"]["spread"] is None and isinstance(
                status["last_val"]["loss"], float
            )

    anyio.run(main)
