"""The same ``NitroError`` written twice from its parts: as Python (``str``) and as the
arguments of a tool call. The tool renderer reads the parts only, never the Python text, so
no rewording of a library message can lose its tool form; a failed job's worker stores the
parts and the server renders them for the job's tool."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client

from nitro_core import Nitro
from nitro_core.errors import (
    WEIGHTS_ONLY,
    Call,
    CheckpointerFix,
    ConfigError,
    FieldFix,
    NitroError,
    Worded,
    arg,
)
from nitro_core.examples import Regression
from nitro_core.jobs.files import JobStatus
from nitro_mcp.refusals import ERROR_MAX, ToolRenderer, for_tool, job_error
from nitro_mcp.server import build_server

from .conftest import call, wait_done

BOTH_WAYS = [  # (parts, tool, as Python writes them, as the tool's refusal writes them)
    ((arg("load_ema", True), " and ", arg("strict", False), " and ", arg("seed", None)),
     "nitro_validate", "load_ema=True and strict=False and seed=None",
     "load_ema=true and strict=false and seed=null"),
    (("Write ", WEIGHTS_ONLY, "."), "nitro_validate", "Write Nitro(exp, weights=...).",
     "Write nitro_validate(..., weights=...)."),
    (("Write ", WEIGHTS_ONLY, "."), "nitro_train", "Write Nitro(exp, weights=...).",
     "Write nitro_train(..., weights=...)."),
    (("Send ", Call("average", {"run_dir": "runs/x", "validate": True}), "."), "nitro_train",
     "Send AverageCall(run_dir='runs/x', validate=True).",
     "Send average(run_dir='runs/x', validate=true)."),
    (("Send ", Call("validate", {"weights": "latest => best", "overrides": {"a": False}}), "."),
     "average", "Send ValidateCall(weights='latest => best', overrides={'a': False}).",
     "Send nitro_validate(weights='latest => best', overrides={'a': false})."),
    (("Keep: ", CheckpointerFix("keep=(Best(3), Last(5))"), "."), "nitro_train",
     "Keep: Checkpointer(keep=(Best(3), Last(5))).",
     "Keep: Checkpointer(keep=(Best(3), Last(5))) returned by the experiment's checkpointer() "
     "(a change to its module)."),
    (("R: bad. ", FieldFix("R", ("max_epochs", "hidden", "lr"), unknown="hiden")), "nitro_train",
     "R: bad. Write R(field=value) with values that fit.",
     'R: bad. Send overrides naming only those fields, e.g. overrides={"hidden": ...}; '
     "nitro_experiments lists R's fields."),
    (("R: bad. ", FieldFix("R", ("lr",), "lr", "float")), "nitro_train",
     "R: bad. Write R(field=value) with values that fit.",
     'R: bad. Send overrides={"lr": <float>} with a value that fits; nitro_experiments lists '
     "R's fields."),
    ((Worded("write True.", "send true."),), "nitro_train", "write True.", "send true."),
]  # fmt: skip


@pytest.mark.parametrize(("parts", "tool", "python", "sent"), BOTH_WAYS)
def test_one_error_is_written_once_for_python_and_once_for_the_tool(parts, tool, python, sent):
    exc = ConfigError(*parts)
    assert (str(exc), for_tool(exc, tool)) == (python, sent)


class _Reworded(ConfigError):
    """An error whose Python text says anything at all: the tool form must not read it."""

    def __str__(self) -> str:
        return "Nitro(exp, weights=...) with restore_optimizer=True, reworded"


def test_the_tool_form_comes_from_the_parts_never_from_the_python_text():
    exc = _Reworded(arg("restore_optimizer", True), " needs ", WEIGHTS_ONLY, ".")
    assert (
        for_tool(exc, "nitro_train")
        == "restore_optimizer=true needs nitro_train(..., weights=...)."
    )
    assert ToolRenderer("average").render(WEIGHTS_ONLY) == "average(..., weights=...)"


def test_a_real_refusal_through_the_server_is_written_as_the_tool_s_arguments(tmp_path):
    with pytest.raises(ConfigError) as exc:
        Nitro(Regression(), run_dir=tmp_path / "r", restore_optimizer=True)
    assert str(exc.value) == (
        "restore_optimizer=True needs weights=...: it takes the optimizer state of the checkpoint "
        "weights= names. Write Nitro(exp, weights='latest => best', restore_optimizer=True), or "
        "resume='latest => latest' to continue exactly."
    )

    async def main():
        async with Client(build_server(tmp_path, max_jobs=0)) as client:
            return await call(
                client, "nitro_train", experiment="Regression", restore_optimizer=True
            )

    err, text = anyio.run(main)
    assert err and text == (
        "Error executing tool nitro_train: restore_optimizer=true needs weights=...: it takes the "
        "optimizer state of the checkpoint weights= names. Write nitro_train(..., weights='latest "
        "=> best', restore_optimizer=true), or resume='latest => latest' to continue exactly."
    )


def _failed(kind, **fields):
    return JobStatus(job_id="j", kind=kind, state="failed", run_dir="r", created="now", **fields)


def test_a_failed_job_s_error_is_rendered_for_the_tool_that_started_it():
    exc = ConfigError(arg("load_ema", True), " needs weights: ", WEIGHTS_ONLY, ".")
    from nitro_core.errors import parts_to_json

    stored = {"error": str(exc), "refusal": parts_to_json(exc.parts)}
    assert job_error(_failed("validate", **stored)) == (
        "load_ema=true needs weights: nitro_validate(..., weights=...)."
    )
    assert (
        job_error(_failed("average", **stored))
        == "load_ema=true needs weights: average(..., weights=...)."
    )
    # an older job, or an error that is no NitroError: its text as recorded, cut when long
    assert job_error(_failed("train", error="ValueError: x")) == "ValueError: x"
    long = job_error(_failed("train", error="y" * 5000))
    assert long == "y" * ERROR_MAX + "… (5000 characters; the job's log holds the whole error)"


def test_a_plain_text_or_plain_message_stands_as_written():
    assert for_tool("resume=True as text", "nitro_train") == "resume=True as text"
    assert for_tool(NitroError("strict=False in prose"), "nitro_train") == "strict=False in prose"


@pytest.mark.slow  # a real worker subprocess through the server; `pytest -m slow`
def test_a_job_that_fails_in_its_worker_reports_the_tool_form(tmp_path):
    """A refusal raised in the worker (one the call's checks could not foresee: a record
    without EMA is refused at the call now) reaches the client in the tool's words, from
    the parts the worker stored: load_ema=true, never the Python load_ema=True."""
    Nitro(Regression(max_epochs=1, samples=64), run_dir=tmp_path / "runs/RefusesToEvaluate").train()
    modules = ("tests.nitro_mcp.worker_refusal_experiment",)

    async def main():
        async with Client(build_server(tmp_path, experiment_modules=modules)) as client:
            err, job = await call(
                client, "nitro_validate", experiment="RefusesToEvaluate",
                run_dir="runs/RefusesToEvaluate", weights="latest => latest", wait_s=0,
            )  # fmt: skip
            assert not err, job
            return await wait_done(client, job["job_id"])

    status = anyio.run(main)
    assert status["state"] == "failed", status
    assert status["error"] == (
        "load_ema=true, but this experiment refuses when its worker evaluates. Drop load_ema."
    ), status["error"]
