"""One call model per operation: ``TrainCall`` is what ``nitro_train``'s schema shows, what a
job's spec stores, what ``nitro train`` parses and what the worker passes to ``Nitro``. A new
option is one field: added to ``TrainCall`` alone (in a copy of the packages), it reaches
``Nitro`` through the MCP tool, the job file and the CLI."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core import Nitro, TrainCall
from nitro_core.jobs.call_models import AverageCall, ValidateCall
from nitro_core.jobs.files import JobSpec
from nitro_mcp.cli import _parser
from nitro_mcp.server import build_server

REPO = Path(__file__).resolve().parents[2]
EMA_REFUSAL = (  # the same refusal as a terminal writes it
    "--load-ema loads the EMA copy of the checkpoint weights= names; write "
    "nitro train ... --weights 'latest => best' --load-ema."
)
EMA_TOOL_REFUSAL = (  # the same refusal as a tool call writes it
    "load_ema=true loads the EMA copy of the checkpoint weights= names; write "
    "nitro_train(..., weights='latest => best', load_ema=true)."
)

# the one edit: a field of TrainCall that maps to an existing keyword of Nitro
NEW_FIELD = '''    load_ema: StrictBool = Field(default=False, description="Train from the EMA weights.")

    def nitro_kwargs(self) -> dict[str, Any]:
        """The keywords of ``Nitro(experiment, ...)``: every field but the experiment, its
        overrides and the process count."""'''

SCRIPT = r"""
import contextlib, io, json, sys
import anyio
from mcp import Client
from nitro_mcp.cli import main
from nitro_mcp.server import build_server

root = sys.argv[1]

async def tool():
    async with Client(build_server(root)) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        schema = listed["nitro_train"].input_schema["properties"]["load_ema"]
        job = (await client.call_tool("nitro_train", {"experiment": "Regression", "load_ema": True,
               "overrides": {"max_epochs": 1, "samples": 64}})).structured_content
        for _ in range(20):  # each call waits up to 25 s for the job's end
            end = (await client.call_tool("nitro_status", {"job_id": job["job_id"], "wait_s": 25,
                   "until": "end", "brief": True})).structured_content
            if end["state"] not in ("queued", "running"):
                return schema, job["job_id"], end
        raise AssertionError(end)

schema, job_id, end = anyio.run(tool)
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(["train", "Regression", "--run-dir", f"{root}/runs/cli", "--load-ema"])
print(json.dumps({"schema": schema, "job_id": job_id, "end": end, "cli": [code, err.getvalue()]}))
"""


@pytest.mark.slow  # a train job and the CLI in subprocesses: the slow suite (the default stays under 4 minutes)
def test_a_new_train_option_is_one_field_and_reaches_nitro_through_the_tool_job_and_cli(tmp_path):
    copy = tmp_path / "copy"
    for package in ("nitro_core", "nitro_mcp"):
        shutil.copytree(REPO / package, copy / package,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    models = copy / "nitro_core" / "jobs" / "call_models.py"
    old = models.read_text()
    anchor = NEW_FIELD.split("\n", 2)[2]
    assert old.count(anchor) == 1  # TrainCall's nitro_kwargs, and no other edit
    models.write_text(old.replace(anchor, NEW_FIELD))
    root = tmp_path / "root"
    root.mkdir()
    env = {**os.environ, "PYTHONPATH": str(copy)}  # the worker it starts imports the copy too
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(root)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # the tool's schema shows it, with its description and default
    assert out["schema"] == {"default": False, "description": "Train from the EMA weights.",
                             "type": "boolean"}  # fmt: skip
    # the job file stores it
    spec = json.loads((root / ".nitro" / "jobs" / out["job_id"] / "spec.json").read_text())
    assert spec["call"]["load_ema"] is True
    # and the worker passed it to Nitro, which refused it (no weights to take an EMA from)
    assert out["end"]["state"] == "failed", out["end"]
    assert out["end"]["error"].startswith(EMA_TOOL_REFUSAL), out["end"]
    # the CLI parsed --load-ema from the field and passed it to Nitro as well
    code, err = out["cli"]
    assert code == 2 and err.startswith(f"nitro train: {EMA_REFUSAL}"), err


def test_the_tool_schema_the_job_spec_the_cli_and_nitro_take_the_call_models_fields(tmp_path):
    async def listing():
        async with Client(build_server(tmp_path)) as client:
            return {t.name: t.input_schema for t in (await client.list_tools()).tools}

    schemas = anyio.run(listing)
    tool_only = {
        "nitro_train": ["after_running", "request_id", "seeds"],
        "nitro_validate": ["wait_s"],
        "average": ["wait_s"],
    }
    for tool, model in (("nitro_train", TrainCall), ("nitro_validate", ValidateCall),
                        ("average", AverageCall)):  # fmt: skip
        sent = [info.alias or name for name, info in model.model_fields.items()]
        assert list(schemas[tool]["properties"]) == sent + tool_only[tool], tool
    (sub,) = [a for a in _parser()._actions if a.dest == "command"]
    for command, model in (("train", TrainCall), ("validate", ValidateCall),
                           ("average", AverageCall)):  # fmt: skip
        # one option per field of the call, generated from it (overrides: --set)
        options = {a.dest for a in sub.choices[command]._actions}
        fields = {info.alias or name for name, info in model.model_fields.items()}
        assert fields - {"overrides"} <= options, (command, fields - options)
        helps = {a.dest: a.help for a in sub.choices[command]._actions}
        for name, info in model.model_fields.items():
            if name not in ("overrides", "experiment", "run_dir") and info.description:
                assert helps[info.alias or name].startswith(
                    info.description.replace("%", "%%")), (command, name)  # fmt: skip
    nitro = set(inspect.signature(Nitro.__init__).parameters)
    assert set(TrainCall(experiment="X").nitro_kwargs()) <= nitro
    assert set(ValidateCall(experiment="X").nitro_kwargs()) <= nitro
    spec = JobSpec.model_validate({"job_id": "j", "kind": "average", "created": "now",
                                   "call": {"run_dir": "r", "validate": True}})  # fmt: skip
    assert isinstance(spec.call, AverageCall) and spec.call.validate_average is True


def test_the_server_reads_no_private_part_of_the_mcp_sdk():
    """The tools are registered with ``add_tool`` and listed and called through the public
    methods; reaching into the SDK's internals would break silently on its next minor."""
    private = re.compile(r"\._tool_manager|\bfn_metadata\b|\barg_model\b|\bvalidate_arguments\b")
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in sorted((REPO / "nitro_mcp").glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert not found, found
