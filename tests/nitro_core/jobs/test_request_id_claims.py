"""Request ids in-process (nitro_core.jobs.request_ids), milliseconds each: which ids are
taken; a retry of one call is one call whatever order its arguments arrive in, also in a
new process (the claim is a file); two attempts racing start one job; an id sent with
another call is refused; an id whose job was pruned is free again. The MCP-level tests,
with real jobs and a server restart, are tests/nitro_mcp/test_request_ids.py (slow)."""

from __future__ import annotations

import threading
import time

import pytest

from nitro_core import CheckpointNotFound, ConfigError
from nitro_core.jobs.request_ids import RequestClaim, call_digest, once


def _once(store, request_id, arguments, started: list[str]):
    def start():
        started.append(f"job-{len(started)}")
        return started[-1]

    return once(store, request_id, call_digest(arguments), lambda job: job, start, id_of=str)


@pytest.mark.parametrize("request_id", ["a", "a" * 128, "sweep-7:lr3e-4_x.1", "7"])
def test_ids_of_1_to_128_characters_are_taken(tmp_path, request_id):
    started: list[str] = []
    assert _once(tmp_path, request_id, {}, started) == ("job-0", False)
    assert _once(tmp_path, request_id, {}, started) == ("job-0", True)
    assert started == ["job-0"]


@pytest.mark.parametrize("request_id", ["a" * 129, "", "-x", ".x", "a b", "a/b", 7])
def test_other_ids_are_refused_before_anything_starts(tmp_path, request_id):
    started: list[str] = []
    with pytest.raises(ConfigError) as caught:
        _once(tmp_path, request_id, {}, started)
    shown = f'"{request_id}"' if isinstance(request_id, str) else str(request_id)
    assert str(caught.value) == (
        f"request_id={shown[:140]} is not a request id; send 1 to 128 letters, digits, '.', '_', "
        "':' or '-' (starting with a letter or digit), e.g. request_id='sweep-7-lr3e-4', the "
        "same for each retry of one call."
    )
    assert started == [] and not (tmp_path / "requests").exists()


def test_a_retry_with_its_arguments_in_another_order_is_the_same_call(tmp_path):
    first = {"experiment": "Regression", "overrides": {"lr": 0.1, "max_epochs": 2}, "seed": 1}
    again = {"seed": 1, "overrides": {"max_epochs": 2, "lr": 0.1}, "experiment": "Regression"}
    assert call_digest(first) == call_digest(again)
    started: list[str] = []
    assert _once(tmp_path, "r-1", first, started) == ("job-0", False)
    assert _once(tmp_path, "r-1", again, started) == ("job-0", True)
    with pytest.raises(ConfigError, match="request_id='r-1' was sent with another call, which "
                       "started job job-0; a request id names one call and its retries"):  # fmt: skip
        _once(tmp_path, "r-1", {**first, "seed": 2}, started)
    assert started == ["job-0"]


def test_an_id_whose_job_was_pruned_is_free_again_and_names_the_new_job(tmp_path):
    started: list[str] = []
    pruned: set[str] = set()

    def find(job: str) -> str:
        if job in pruned:
            raise CheckpointNotFound(f"no job {job}")
        return job

    def again() -> tuple[str, bool]:
        def start():
            started.append(f"job-{len(started)}")
            return started[-1]

        return once(tmp_path, "r-1", call_digest({"seed": 1}), find, start, id_of=str)

    assert again() == ("job-0", False)
    pruned.add("job-0")  # nitro_prune removed the job the id started
    assert again() == ("job-1", False)
    assert again() == ("job-1", True)  # the id now names the job it started second
    assert started == ["job-0", "job-1"]
    (claim,) = (tmp_path / "requests").iterdir()
    assert RequestClaim.model_validate_json(claim.read_bytes()).job_id == "job-1"


def test_a_retry_in_a_new_process_reads_the_claim_from_the_store(tmp_path):
    """What a server restart keeps: the claim on disk, not anything in memory."""
    started: list[str] = []
    assert _once(tmp_path, "r-1", {"seed": 1}, started) == ("job-0", False)
    (claim,) = (tmp_path / "requests").iterdir()
    assert RequestClaim.model_validate_json(claim.read_bytes()) == RequestClaim(
        request_id="r-1", job_id="job-0", call=call_digest({"seed": 1})
    )
    assert _once(tmp_path, "r-1", {"seed": 1}, []) == ("job-0", True)


def test_two_attempts_racing_start_one_job(tmp_path):
    started: list[str] = []
    both = threading.Barrier(2)
    replies: list[tuple[str, bool]] = []

    def start():
        time.sleep(0.05)  # the first attempt is still starting when the second looks
        started.append(f"job-{len(started)}")
        return started[-1]

    def attempt():
        both.wait()
        digest = call_digest({"seed": 1})
        replies.append(once(tmp_path, "r-1", digest, lambda job: job, start, id_of=str))

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert started == ["job-0"]
    assert sorted(replies) == [("job-0", False), ("job-0", True)]


def test_an_id_sent_with_another_call_is_refused_naming_its_job(tmp_path):
    started: list[str] = []
    _once(tmp_path, "r-1", {"seed": 1}, started)
    with pytest.raises(ConfigError) as caught:
        _once(tmp_path, "r-1", {"seed": 2}, started)
    assert str(caught.value) == (
        "request_id='r-1' was sent with another call, which started job job-0; a request id "
        "names one call and its retries. Send this call with a new request_id, or resend that "
        "call unchanged to get its job."
    )
    assert started == ["job-0"]


def test_a_claim_file_nitro_did_not_write_is_replaced(tmp_path, caplog):
    started: list[str] = []
    _once(tmp_path, "r-1", {}, started)
    (claim,) = (tmp_path / "requests").iterdir()
    claim.write_text("not json")
    assert _once(tmp_path, "r-1", {}, started) == ("job-1", False)
    assert f"{claim} is not a request claim Nitro wrote; it is replaced" in caplog.text
