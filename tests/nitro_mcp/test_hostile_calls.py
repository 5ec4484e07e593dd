"""Hostile calls: the server's own state directory, names the file system refuses, files
where directories belong, huge cursors and seeds, unknown devices and oversized configs.
Each is answered at once with an actionable tool error (inputs echoed cut to 80
characters), starts no job and writes nothing; a foreign file in the job store never
breaks listing."""

from __future__ import annotations

import errno

import anyio
import pytest
import torch
from mcp import Client

from nitro_core import Nitro, read_manifest
from nitro_core.examples import Regression
from nitro_mcp.server import build_server
from nitro_mcp.tools import record_tools

from .conftest import call

E = "Error executing tool {tool}: "
INSIDE_STATE = (
    "{what}={value} is inside '.nitro', the server's own state directory (its job store), which "
    "no tool reads or writes through a path; give a path outside it, {eg}."
)
LONG_NAME = (
    "{what}={value} has a name of 256 bytes ('aaaaaaaaaaaaaaaaaaaa…'); a file or directory name "
    "is at most 255 bytes. Give a shorter name, {eg}."
)
EG = {  # a value for each path argument, written as the argument
    "run_dir": "e.g. run_dir='runs/Classifier'",
    "save": "e.g. save='runs/Classifier/avg10.safetensors'",
    "path": "e.g. path='runs/Classifier/weights.safetensors'",
}
NOT_A_DEVICE = "device={value} is not a device; write 'auto', 'cpu' or 'cuda:0'."
A256, A80 = "a" * 256, "a" * 80

HOSTILE_CALLS = [
    # the job store is off limits to every path argument
    ("nitro_train", {"experiment": "Regression", "run_dir": ".nitro/jobs"},
     INSIDE_STATE.format(what="run_dir", eg=EG["run_dir"], value="'.nitro/jobs'")),
    ("nitro_train", {"experiment": "Regression", "run_dir": ".nitro"},
     INSIDE_STATE.format(what="run_dir", eg=EG["run_dir"], value="'.nitro'")),
    ("nitro_train", {"experiment": "Regression", "run_dir": "runs/../.nitro/x"},
     INSIDE_STATE.format(what="run_dir", eg=EG["run_dir"], value="'runs/../.nitro/x'")),
    ("nitro_train", {"experiment": "Regression", "run_dir": "state/jobs"},  # a symlink to .nitro
     INSIDE_STATE.format(what="run_dir", eg=EG["run_dir"], value="'state/jobs'")),
    ("average", {"run_dir": "runs", "save": ".nitro/jobs/x.safetensors"},
     INSIDE_STATE.format(what="save", eg=EG["save"], value="'.nitro/jobs/x.safetensors'")),
    ("nitro_runs", {"run_dir": ".nitro/jobs"}, INSIDE_STATE.format(what="run_dir", eg=EG["run_dir"], value="'.nitro/jobs'")),
    ("nitro_manifest", {"run_dir": ".nitro"}, INSIDE_STATE.format(what="run_dir", eg=EG["run_dir"], value="'.nitro'")),
    ("nitro_checkpoint_info", {"path": ".nitro/jobs/j/spec.json"},
     INSIDE_STATE.format(what="path", eg=EG["path"], value="'.nitro/jobs/j/spec.json'")),
    # a sibling whose name starts with the root's name is outside it
    ("nitro_train", {"experiment": "Regression", "run_dir": "../root2/runs"}, None),
    ("nitro_runs", {"run_dir": "{tmp}/root2"}, None),
    # names the file system would refuse
    ("nitro_train", {"experiment": "Regression", "run_dir": A256},
     LONG_NAME.format(what="run_dir", eg=EG["run_dir"], value=f"'{A80}…'")),
    ("nitro_runs", {"run_dir": f"runs/{A256}"}, LONG_NAME.format(what="run_dir", eg=EG["run_dir"], value=f"'runs/{'a' * 75}…'")),
    ("average", {"run_dir": "runs", "save": f"runs/{A256}.safetensors"},
     LONG_NAME.format(what="save", eg=EG["save"], value=f"'runs/{'a' * 75}…'").replace("256 bytes", "268 bytes")),
    ("nitro_checkpoint_info", {"path": A256}, LONG_NAME.format(what="path", eg=EG["path"], value=f"'{A80}…'")),
    ("nitro_train", {"experiment": "Regression", "run_dir": "a/" * 2100},
     f"run_dir='{'a/' * 40}…' is 4200 bytes long; a path is at most 4095 bytes here. Give a shorter path, "
     "e.g. run_dir='runs/Classifier'."),
    # a file where a directory belongs
    ("nitro_train", {"experiment": "Regression", "run_dir": "notes.txt"},
     "run_dir='notes.txt' is a file, not a directory; give a directory (it is created when missing), "
     "e.g. run_dir='runs/Classifier'."),
    ("nitro_train", {"experiment": "Regression", "run_dir": "notes.txt/sub"},
     "run_dir='notes.txt/sub' lies under the file 'notes.txt', not a directory; give a directory (it is "
     "created when missing), e.g. run_dir='runs/Classifier'."),
    ("average", {"run_dir": "notes.txt"},
     "run_dir='notes.txt' is a file, not a directory; give a directory (it is created when missing), "
     "e.g. run_dir='runs/Classifier'."),
    ("nitro_manifest", {"run_dir": "notes.txt"},
     "run_dir='notes.txt' is a file, not a directory; give a directory (it is created when missing), "
     "e.g. run_dir='runs/Classifier'."),
    ("nitro_validate", {"experiment": "Regression", "run_dir": "notes.txt"},
     "run_dir='notes.txt' is a file, not a directory; give a directory (it is created when missing), "
     "e.g. run_dir='runs/Classifier'."),
    ("average", {"run_dir": "runs", "save": "notes.txt/avg.safetensors"},
     "save='notes.txt/avg.safetensors' lies under the file 'notes.txt', not a directory; give a path in a "
     "directory, e.g. save='runs/Classifier/avg10.safetensors'."),
    # numbers too long to read, devices torch would refuse later, oversized configs
    ("nitro_jobs", {"cursor": "9" * 4300},
     f"cursor='{'9' * 80}…' is not a cursor; pass the next_cursor of the previous page."),
    ("nitro_manifest", {"run_dir": ".", "cursor": "1" * 5000},
     f"cursor='{'1' * 80}…' is not a cursor; pass the next_cursor of the previous page."),
    ("nitro_jobs", {"limit": 10**30}, "limit=1000000000000000000000000000000 is out of range; give 1 to 100."),
    ("nitro_train", {"experiment": "Regression", "seed": 10**100},
     "seed=(an integer of about 101 digits) is not a seed; write an integer from 0 to 2**63 - 1, e.g. seed=0."),
    ("nitro_train", {"experiment": "Regression", "device": "meta"}, NOT_A_DEVICE.format(value="'meta'")),
    ("nitro_train", {"experiment": "Regression", "device": "mps"}, NOT_A_DEVICE.format(value="'mps'")),
    ("nitro_train", {"experiment": "Regression", "device": "cpu:0"}, NOT_A_DEVICE.format(value="'cpu:0'")),
    ("nitro_train", {"experiment": "Regression", "device": "cuda:x"}, NOT_A_DEVICE.format(value="'cuda:x'")),
    ("nitro_train", {"experiment": "Regression", "device": "x" * 500},
     NOT_A_DEVICE.format(value=f"'{'x' * 80}…'")),
    ("nitro_train", {"experiment": "E" * 1000},
     f"Unknown experiment '{'E' * 80}…'; registered experiments are: CausalLM, Classifier, HFCausalLM, Regression. Use one of those "
     "names, or register yours with the 'nitro.experiments' entry-point group or --experiment-module when "
     "starting the server."),
    ("nitro_train", {"experiment": "Regression", "overrides": {"k" * 500: 1}},
     f"overrides['{'k' * 80}…']=1 is too long: a field name is at most 80 characters and a value at most "
     "1000; nitro_experiments lists each experiment's fields."),
    ("nitro_train", {"experiment": "Regression", "overrides": {"hidden": "w" * 5000}},
     f"overrides['hidden']='{'w' * 80}…' is too long: a field name is at most 80 characters and a value at "
     "most 1000; nitro_experiments lists each experiment's fields."),
    ("nitro_train", {"experiment": "Regression", "overrides": {"samples": 10**12}},
     "Regression: field 'samples' expects int, got 1000000000000 (int): Input should be less than or equal "
     "to 100000. Send overrides={\"samples\": <int>} with a value that fits; nitro_experiments lists "
     "Regression's fields."),
    ("nitro_train", {"experiment": "Classifier", "overrides": {"max_epochs": 10**9}},
     "Classifier: field 'max_epochs' expects int, got 1000000000 (int): Input should be less than or equal "
     "to 10000. Send overrides={\"max_epochs\": <int>} with a value that fits; nitro_experiments lists "
     "Classifier's fields."),
    ("nitro_validate", {"experiment": "Regression", "overrides": {"features": 10**6}},
     "Regression: field 'features' expects int, got 1000000 (int): Input should be less than or equal to "
     "256. Send overrides={\"features\": <int>} with a value that fits; nitro_experiments lists "
     "Regression's fields."),
    ("nitro_status", {"job_id": "a" * 100},
     f"job_id='{A80}…' is not a job id; nitro_jobs lists them (e.g. job_id='20261129-072848-63c6e6')."),
]  # fmt: skip
if not torch.cuda.is_available():
    HOSTILE_CALLS.append(
        ("nitro_train", {"experiment": "Regression", "device": "cuda:0"},
         "device='cuda:0' asks for CUDA, which this machine lacks; write 'auto' or 'cpu'.")
    )  # fmt: skip


def snapshot(directory):
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    HOSTILE_CALLS,
    ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(HOSTILE_CALLS)],
)
def test_hostile_calls_are_refused_at_once_with_what_to_write(tmp_path, tool, args, message):
    root = tmp_path / "root"
    (root / ".nitro" / "jobs").mkdir(parents=True)
    (root / "runs").mkdir()
    (root / "notes.txt").write_text("not a directory")
    (root / "state").symlink_to(root / ".nitro")
    (tmp_path / "root2").mkdir()  # a sibling: '<root>2' starts with the root's own path
    args = {k: v.format(tmp=tmp_path) if k == "run_dir" else v for k, v in args.items()}
    before_outside, before_root = snapshot(tmp_path), snapshot(root)

    async def main():
        async with Client(build_server(root, max_jobs=0)) as client:  # a job would only queue
            return await call(client, tool, **args)

    err, text = anyio.run(main)
    assert err, text
    prefix = E.format(tool=tool)
    assert text.startswith(prefix), text
    if message is None:
        assert "outside the server's root" in text and "give a path inside it" in text, text
    else:
        assert text[len(prefix) :] == message
    assert len(text) < 1000
    assert snapshot(tmp_path) == before_outside  # no job, no file, inside the root or out
    assert snapshot(root) == before_root


def test_a_foreign_file_in_the_job_store_never_breaks_listing(tmp_path):
    jobs = tmp_path / ".nitro" / "jobs"

    async def main():
        async with Client(build_server(tmp_path, max_jobs=0)) as client:
            err, job = await call(client, "nitro_train", experiment="Regression")
            assert not err and job["state"] == "queued", job
            # whatever lands in the job store: a record, junk, a copy of a job, an empty dir
            (jobs / "x.safetensors").write_bytes(b"\0" * 64)
            (jobs / "junk").mkdir()
            (jobs / "junk" / "status.json").write_text("{not json")
            (jobs / "copy").mkdir()
            (jobs / "copy" / "status.json").write_bytes(
                (jobs / job["job_id"] / "status.json").read_bytes()
            )
            (jobs / "empty").mkdir()
            (jobs / "nested").mkdir()
            (jobs / "nested" / "status.json").mkdir()
            for _ in range(2):  # and again, as a restarted server scans it
                err, page = await call(client, "nitro_jobs")
                assert not err, page
                assert [j["job_id"] for j in page["jobs"]] == [job["job_id"]]
                err, status = await call(client, "nitro_status", job_id=job["job_id"])
                assert not err and status["state"] == "queued", status
            for name in ("junk", "copy", "empty", "nested"):
                err, text = await call(client, "nitro_status", job_id=name)
                assert err and text.endswith(
                    f"No job {name!r} under {str(jobs)!r}; nitro_jobs lists the jobs there."
                ), text
            err, second = await call(
                client, "nitro_train", experiment="Regression", run_dir="runs/second"
            )  # another run_dir: a second job on the first's is refused
            assert not err and second["state"] == "queued", second
            err, stopped = await call(client, "nitro_stop", job_id=job["job_id"])
            assert not err and stopped["state"] == "stopped", stopped
            err, page = await call(client, "nitro_jobs")
            assert not err and {j["job_id"] for j in page["jobs"]} == {
                job["job_id"],
                second["job_id"],
            }

    anyio.run(main)


def test_resume_auto_with_a_changed_plain_config_is_refused_at_the_call(tmp_path):
    small = {"max_epochs": 1, "samples": 64, "hidden": 8}
    Nitro(Regression(**small), run_dir=tmp_path / "runs/Regression").train()
    store = tmp_path / ".nitro" / "jobs"

    async def main():
        async with Client(build_server(tmp_path, max_jobs=0)) as client:
            return await call(
                client,
                "nitro_train",
                experiment="Regression",
                overrides={**small, "hidden": 16, "max_epochs": 2},
                resume="auto",
            )

    err, text = anyio.run(main)
    (entry,) = read_manifest(tmp_path / "runs/Regression")
    assert err and text == (
        f"Error executing tool nitro_train: resume='auto' continues run {entry.run} under its "
        "recorded config; overrides may change only Host fields (max_epochs), and these change "
        "plain fields: hidden: 8 (record) -> 16 (call). Drop overrides={'hidden': 16} to resume: "
        "nitro_train(experiment='Regression', run_dir='runs/Regression', resume='auto', "
        "overrides={'max_epochs': 2, 'samples': 64}), a new run from its weights would not load "
        f"them under these overrides: Checkpoint 'runs/Regression/{entry.file}' does not fit "
        "Regression's model: leaf '0.weight' has size [8, 8] in the record and [16, 8] in the "
        "model. Build the model the record was written with (same config), or train a new run."
    )  # a branch that cannot load its weights is not proposed
    assert not store.exists() or not list(store.iterdir())  # refused before any job existed


def test_a_file_system_error_the_checks_missed_is_still_an_actionable_tool_error(
    tmp_path, monkeypatch
):
    def broken_disk(gate, run_dir, *page):
        raise OSError(errno.EIO, "Input/output error", str(tmp_path / "runs" / ("r" * 200)))

    monkeypatch.setattr(record_tools, "runs", broken_disk)

    async def main():
        async with Client(build_server(tmp_path)) as client:
            return await call(client, "nitro_runs", run_dir="runs")

    err, text = anyio.run(main)
    shown = str(tmp_path / "runs" / ("r" * 200))[:80]
    assert err and text == (
        f"Error executing tool nitro_runs: nitro_runs failed: Input/output error at '{shown}…'. "
        "Check the path arguments (inside the server's root, names of at most 255 bytes, "
        "directories where a directory is meant) and the disk, then call again."
    )
