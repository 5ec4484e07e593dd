"""``nitro_train(..., request_id=...)``: a retried call gets the job its first attempt
started, through the real MCP client: again, across a server restart, and when two attempts
race; the id sent with another call is refused; a pruned job frees its id."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client

from nitro_mcp.server import build_server
from tests.nitro_mcp.conftest import call, wait_done

TRAIN = {"experiment": "Regression", "overrides": {"max_epochs": 1, "samples": 64}}


def _job_ids(root) -> list[str]:
    return sorted(p.name for p in (root / ".nitro" / "jobs").iterdir())


@pytest.mark.slow  # a job and a server restart: the slow suite (the default stays under 4 minutes)
def test_a_retry_gets_the_first_calls_job_also_after_a_restart(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            err, first = await call(client, "nitro_train", **TRAIN, request_id="sweep-1")
            assert not err, first
            err, again = await call(client, "nitro_train", **TRAIN, request_id="sweep-1")
            assert not err, again
            await wait_done(client, first["job_id"])
        async with Client(build_server(tmp_path)) as client:  # a new server on the same root
            err, later = await call(client, "nitro_train", **TRAIN, request_id="sweep-1")
            assert not err, later
        return first, again, later

    first, again, later = anyio.run(main)
    assert first["duplicate"] is False
    assert again["duplicate"] is True and later["duplicate"] is True
    assert again["job_id"] == later["job_id"] == first["job_id"]
    assert later["state"] == "succeeded"  # the job as it stands now
    assert again["next"].startswith("An earlier call with request_id='sweep-1' started this job; ")
    assert _job_ids(tmp_path) == [first["job_id"]]  # one job, one run
    assert len(list((tmp_path / "runs" / "Regression").glob("*.safetensors"))) == 1


@pytest.mark.slow  # jobs in worker processes: the slow suite (the default stays under 4 minutes)
def test_two_attempts_racing_start_one_job(tmp_path):
    replies: list[dict] = []

    async def attempt(client: Client) -> None:
        err, reply = await call(client, "nitro_train", **TRAIN, request_id="race")
        assert not err, reply
        replies.append(reply)

    async def main():
        async with Client(build_server(tmp_path)) as a, Client(build_server(tmp_path)) as b:
            async with anyio.create_task_group() as tg:
                tg.start_soon(attempt, a)
                tg.start_soon(attempt, b)
            await wait_done(a, replies[0]["job_id"])

    anyio.run(main)
    assert {r["job_id"] for r in replies} == set(_job_ids(tmp_path))
    assert len(_job_ids(tmp_path)) == 1
    assert sorted(r["duplicate"] for r in replies) == [False, True]


@pytest.mark.slow  # a job in a worker process: the slow suite (the default stays under 4 minutes)
def test_an_id_sent_with_another_call_is_refused_and_starts_nothing(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            err, first = await call(client, "nitro_train", **TRAIN, request_id="r-7")
            assert not err, first
            other = {**TRAIN, "overrides": {"max_epochs": 2, "samples": 64}}
            refused = await call(client, "nitro_train", **other, request_id="r-7")
            bad = await call(client, "nitro_train", **TRAIN, request_id="a b/../c")
            await wait_done(client, first["job_id"])
            return first, refused, bad

    first, refused, bad = anyio.run(main)
    assert refused == (
        True,
        f"Error executing tool nitro_train: request_id='r-7' was sent with another call, which "
        f"started job {first['job_id']}; a request id names one call and its retries. Send "
        "this call with a new request_id, or resend that call unchanged to get its job.",
    )
    assert bad == (
        True,
        'Error executing tool nitro_train: request_id="a b/../c" is not a request id; send 1 '
        "to 128 letters, digits, '.', '_', ':' or '-' (starting with a letter or digit), e.g. "
        "request_id='sweep-7-lr3e-4', the same for each retry of one call.",
    )
    assert _job_ids(tmp_path) == [first["job_id"]]


@pytest.mark.slow  # a full job twice and a prune: the slow suite's
def test_a_pruned_jobs_id_is_free_again(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            err, first = await call(client, "nitro_train", **TRAIN, request_id="p")
            assert not err, first
            await wait_done(client, first["job_id"])
            with anyio.fail_after(120):  # prunable once its worker has exited too
                while True:
                    err, listed = await call(client, "nitro_jobs", prune_older_than_h=0)
                    assert not err, listed
                    if first["job_id"] in listed["pruned"]["jobs"]:
                        break
                    await anyio.sleep(0.1)
            err, pruned = await call(client, "nitro_jobs", prune_older_than_h=0, dry_run=False)
            assert not err and pruned["pruned"]["jobs"] == [first["job_id"]], pruned
            assert _job_ids(tmp_path) == []
            err, second = await call(client, "nitro_train", **TRAIN, request_id="p")
            assert not err, second
            await wait_done(client, second["job_id"])
            return first, second

    first, second = anyio.run(main)
    assert second["duplicate"] is False and second["job_id"] != first["job_id"]
    assert _job_ids(tmp_path) == [second["job_id"]]
