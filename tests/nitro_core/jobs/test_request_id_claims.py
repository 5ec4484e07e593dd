"""Request ids in-process (nitro_core.jobs.request_ids): which ids are taken, and that a
retry of one call is one call whatever order its arguments arrive in (the MCP-level tests,
with real jobs, are tests/nitro_mcp/test_request_ids.py)."""

from __future__ import annotations

import pytest

from nitro_core import ConfigError
from nitro_core.jobs.request_ids import call_digest, once


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
