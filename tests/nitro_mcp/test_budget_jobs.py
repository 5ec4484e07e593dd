"""``nitro_train(..., max_steps=N)`` and ``time_limit=S``: the job ends ``stopped`` with the
run's ``stop_reason="budget"`` and its record written, and ``resume="auto"`` continues it;
a bad budget is refused at the call."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client

from nitro_core import read_manifest
from nitro_core.store.recordio import read_header
from nitro_mcp.server import build_server
from tests.nitro_mcp.conftest import call, wait_done


@pytest.mark.slow  # two train jobs in worker processes: the slow suite (the default stays under 4 minutes)
def test_a_budgeted_job_stops_with_budget_and_resume_auto_finishes_it(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            overrides = {"max_epochs": 3, "samples": 256}  # several steps an epoch (batch 64)
            err, job = await call(
                client, "nitro_train", experiment="Regression", overrides=overrides, max_steps=5
            )
            assert not err, job
            status = await wait_done(client, job["job_id"])
            assert status["state"] == "stopped", status
            assert status["result"]["stop_reason"] == "budget", status
            err, again = await call(
                client, "nitro_train", experiment="Regression", overrides=overrides,
                resume="auto", time_limit=3600,
            )  # fmt: skip
            assert not err, again
            return status, await wait_done(client, again["job_id"])

    first, second = anyio.run(main)
    entries = read_manifest(tmp_path / "runs" / "Regression")
    budget = [e for e in entries if e.stop_reason == "budget"]
    assert len(budget) == 1 and budget[0].step == first["result"]["step"]
    run_dir = tmp_path / "runs" / "Regression"
    assert read_header(run_dir / budget[0].file)["budget"] == {"max_steps": 5, "time_limit": None}
    last = read_header(run_dir / entries[-1].file)  # each record: the budget it was written under
    assert last["budget"] == {"max_steps": None, "time_limit": 3600}
    assert second["state"] == "succeeded", second
    assert second["result"]["stop_reason"] == "completed"
    assert second["result"]["run_id"] == first["result"]["run_id"]  # the same run, continued


def test_a_bad_budget_is_refused_at_the_call_with_what_to_send(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            props = listed["nitro_train"].input_schema["properties"]
            steps = await call(client, "nitro_train", experiment="Regression", max_steps=0)
            time = await call(client, "nitro_train", experiment="Regression", time_limit=-5)
            return props, steps, time

    props, (err_steps, steps), (err_time, time) = anyio.run(main)
    assert "max_steps" in props and "time_limit" in props
    assert (
        err_steps
        and (
            "max_steps=0 is not a step budget; send a positive integer, e.g. max_steps=1000 "
            "(optimizer steps of the run, counted from its start), or leave it out."
        )
        in steps
    )
    assert (
        err_time
        and (
            "time_limit=-5 is not a time budget; send a positive number of seconds, e.g. "
            "time_limit=3600, or leave it out."
        )
        in time
    )
    assert not (tmp_path / ".nitro" / "jobs").exists() or not any(
        (tmp_path / ".nitro" / "jobs").iterdir()
    )  # no job created
