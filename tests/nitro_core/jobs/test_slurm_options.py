"""Slurm options are data (DESIGN section 16): each is checked against a pattern the
published schema shows, and reaches ``sbatch`` as one argv element; the batch script is a
constant that holds no caller text. The hostile table is refused at the call, through the
call model, the MCP gate and the CLI, with the pattern in the message; a legitimate call's
command line holds each option whole and the script none of them. The cluster itself runs
these in tests/nitro_mcp/test_slurm_executor.py."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client
from pydantic import ValidationError

from nitro_core.jobs import slurm
from nitro_core.jobs.call_models import SLURM_EXTRA, SLURM_GRES, SLURM_NAME, SlurmOptions, TrainCall
from nitro_mcp.server import build_server

HOSTILE = [
    ("account", "acct\ntouch x"),
    ("account", "acct\rtouch x"),
    ("qos", "$(touch x)"),
    ("partition", "`touch x`"),
    ("gres", "gpu:1;touch x"),
    ("account", "a b"),
    ("account", "-o/elsewhere"),
    ("partition", "debug\x00"),
    ("gres", "gpu:1\t--output=/x"),
    ("account", "a" * 1_000_000),
    ("qos", "normal'"),
    ("partition", ""),
]
HOSTILE_EXTRA = [
    "--comment=x --output=/elsewhere",  # a second option on one line
    "--comment=x\n#SBATCH --output=/x",
    "--comment=$(touch x)",
    "--comment=`touch x`",
    "--comment=a;b",
    "--mem=-1G",  # a value with a leading -
    "--mem=16G\r",
    "--constraint volta",  # a space, not =
    "--mem=" + "1" * 1_000_000,
    " --nice=5",
]
OUTSIDE = ["--output=/tmp/x", "--chdir=/", "-o /tmp/x", "--mem-bind=local", "", "--wrap=ls"]


@pytest.mark.parametrize(("field", "value"), HOSTILE)
def test_a_hostile_slurm_option_is_refused_by_the_call_model_with_its_pattern(field, value):
    pattern = SLURM_GRES if field == "gres" else SLURM_NAME
    with pytest.raises(ValidationError) as caught:
        TrainCall(experiment="Regression", executor="slurm", slurm={field: value})
    text = str(caught.value)
    assert f"slurm.{field}=" in text and f"it must match {pattern}" in text, text
    assert len(text) < 2000  # a 1 MB value is clipped, never echoed whole


@pytest.mark.parametrize("item", HOSTILE_EXTRA)
def test_an_extra_item_that_is_not_one_allowed_option_is_refused_with_its_pattern(item):
    with pytest.raises(ValidationError) as caught:
        SlurmOptions(extra=["--mem=1G", item])
    text = str(caught.value)
    assert f"each item is one --name=value matching {SLURM_EXTRA}" in text, text
    assert (
        "Send one option an item, e.g. slurm={'extra': ['--mem=16G', '--comment=nightly']}" in text
    )
    assert len(text) < 3000


@pytest.mark.parametrize("item", OUTSIDE)
def test_an_extra_option_outside_the_allow_list_is_refused_naming_the_list(item):
    with pytest.raises(ValidationError) as caught:
        SlurmOptions(extra=["--mem=1G", item])
    assert (
        f"slurm.extra line {item!r} is not an sbatch option Nitro passes on: the job's "
        "directory, output and working directory are Nitro's. Send only --mem, "
    ) in str(caught.value)
    assert "e.g. slurm={'extra': ['--mem=16G']}." in str(caught.value)


@pytest.mark.parametrize(
    "options",
    [
        {"partition": "debug", "account": "proj-a_1.x", "qos": "high,normal", "gres": "gpu:a100:2"},
        {"extra": ["--mem=16G", "--exclusive", "--constraint=volta", "--nodelist=n[1-4]",
                   "--mail-user=me@example.org", "--nice=5", "--comment=run/7%a+b"]},
    ],
)  # fmt: skip
def test_legitimate_options_pass(options):
    assert SlurmOptions(**options).model_dump(exclude_defaults=True) == options


def test_the_published_schema_shows_each_pattern():
    schema = TrainCall.model_json_schema()
    props = schema["$defs"]["SlurmOptions"]["properties"]
    assert props["account"]["anyOf"][0]["pattern"] == SLURM_NAME
    assert props["gres"]["anyOf"][0]["pattern"] == SLURM_GRES
    assert props["extra"]["items"]["pattern"] == SLURM_EXTRA


def test_the_gate_refuses_a_newline_in_an_option_before_any_job_exists(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            result = await client.call_tool("nitro_train", {
                "experiment": "Regression", "executor": "slurm",
                "slurm": {"account": "acct\ntouch x", "extra": ["--comment=x --output=/e"]}})  # fmt: skip
            return result.is_error, result.content[0].text

    err, text = anyio.run(main)
    assert err, text
    assert text.startswith(
        "Error executing tool nitro_train: slurm.account='acct\\ntouch x' is not a Slurm "
        f"account: it must match {SLURM_NAME} (no space, control character, quote or shell "
        "character, no leading '-'). Send e.g. slurm={'account': 'research'}; slurm.extra item "
    ), text
    assert "slurm.extra item '--comment=x --output=/e' is not one sbatch option" in text
    assert not (tmp_path / ".nitro" / "jobs").exists() or not any(
        (tmp_path / ".nitro" / "jobs").iterdir()
    )


def _call(**kw):
    return TrainCall(experiment="Regression", executor="slurm", **kw)


def test_sbatch_gets_each_option_as_one_argument_and_the_script_holds_no_caller_text(tmp_path):
    root = tmp_path / "a root with spaces"
    directory = root / ".nitro" / "jobs" / "j1"
    options = {"partition": "debug", "account": "proj-7", "qos": "high", "gres": "gpu:2",
               "extra": ["--mem=16G", "--comment=nightly-sweep"]}  # fmt: skip
    argv = slurm.sbatch_argv(_call(slurm=options, nodes=2, nproc=3), directory, root, "nitro-j1")
    assert argv == [
        "--job-name=nitro-j1", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=3",
        f"--output={directory / 'log.txt'}", "--open-mode=append", f"--chdir={root}",
        "--signal=B:TERM@60", "--partition=debug", "--account=proj-7", "--gres=gpu:2",
        "--qos=high", "--mem=16G", "--comment=nightly-sweep",
    ]  # fmt: skip
    for value in ["debug", "proj-7", "high", "gpu:2", "16G", "nightly", str(root), "j1"]:
        assert value not in slurm.SCRIPT
    assert slurm.SCRIPT.rstrip().endswith('exec "$@"')
    assert slurm.worker_argv(directory)[-1] == str(directory)  # the path as one element


@pytest.mark.parametrize(("limit", "minutes"), [(None, None), (1, 3), (600, 13), (3600, 69)])
def test_the_time_limit_lies_above_the_budget_by_its_margin(tmp_path, limit, minutes):
    argv = slurm.sbatch_argv(_call(time_limit=limit), tmp_path, tmp_path, "n")
    times = [a for a in argv if a.startswith("--time=")]
    assert times == ([] if minutes is None else [f"--time={minutes}"])  # ceil((t*1.1+120)/60)
    assert "--signal=B:TERM@60" in argv  # the worker's TERM a minute before Slurm's kill
