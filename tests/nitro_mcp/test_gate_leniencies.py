"""The gate's leniencies of issue 19, each refused at the call: a flag sent as a string or a
number, a restore_best the run can never reach, a record under the wrong experiment or
architecture, more processes than the machine has room for, and a path that is no record.
A run that ends short of its restore_best says so in its status, not only in its result."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core import Nitro, read_manifest
from nitro_core.examples import Regression
from nitro_core.jobs.rank_launch import process_limit
from nitro_mcp.cli import main as cli
from nitro_mcp.server import build_server

from .conftest import call, wait_done

E = "Error executing tool {tool}: "
HERE = Path(__file__).parent


def _refusals(root, calls, **server):
    async def main():
        async with Client(build_server(root, **server)) as client:
            return [await call(client, tool, **args) for tool, args in calls]

    return anyio.run(main)


def _jobs(root: Path) -> list[str]:
    jobs = root / ".nitro" / "jobs"
    return sorted(p.name for p in jobs.iterdir()) if jobs.is_dir() else []


FLAGS = [
    ("nitro_delete", {"run_dir": "runs/x", "dry_run": "no"},
     'dry_run must be true or false (a JSON boolean), not the string "no": send {"dry_run": false} '
     "(false: really delete)."),
    ("nitro_delete", {"run_dir": "runs/x", "dry_run": "false"},
     'dry_run must be true or false (a JSON boolean), not the string "false": send {"dry_run": false} '
     "(false: really delete)."),
    ("nitro_jobs", {"prune_older_than_h": 0, "dry_run": 0},
     'dry_run must be true or false (a JSON boolean), not the number 0: send {"dry_run": false} '
     "(false: prune for real)."),
    ("nitro_stop", {"job_id": "x", "force": "maybe"},
     'force must be true or false (a JSON boolean), not the string "maybe": send {"force": true} or '
     '{"force": false} (Kill now, not after the epoch).'),
    ("average", {"run_dir": "runs/x", "validate": "yes"},
     'validate must be true or false (a JSON boolean), not the string "yes": send {"validate": true} '
     "(Also evaluate it on split)."),
    ("nitro_validate", {"experiment": "Regression", "load_ema": "true"},
     'load_ema must be true or false (a JSON boolean), not the string "true": send {"load_ema": true} '
     "(Evaluate its EMA weights)."),
    ("nitro_status", {"job_id": "x", "brief": 1},
     'brief must be true or false (a JSON boolean), not the number 1: send {"brief": true} (Only state, '
     "epoch, step, progress, last metrics, error and next)."),
    ("nitro_train", {"experiment": "Regression", "strict": "False"},
     'strict must be true or false (a JSON boolean), not the string "False": send {"strict": false} '
     "(false: load weights by name, warn on the rest)."),
    ("nitro_train", {"experiment": "Regression", "after_running": "off"},
     'after_running must be true or false (a JSON boolean), not the string "off": send '
     '{"after_running": false} (Queue behind a job training run_dir (false: refuse)).'),
    ("nitro_train", {"experiment": "Regression", "restore_optimizer": []},
     "restore_optimizer must be true or false (a JSON boolean), not a list: send "
     '{"restore_optimizer": true} or {"restore_optimizer": false} (With weights: its optimizer '
     "state too)."),
    ("nitro_train", {"experiment": "Regression", "resume": "no"},
     'resume="no" is a string that spells a boolean, not a source: send {"resume": false} (a new run), '
     '{"resume": "auto"} (continue the latest record, or start fresh) or a source such as '
     '{"resume": "latest => latest"}.'),
    ("nitro_train", {"experiment": "Regression", "restore_best": "yes"},
     'restore_best="yes" is a string that spells a boolean, not an average: send {"restore_best": false}, '
     '{"restore_best": true} (end holding the run\'s best checkpoint) or an average such as '
     '{"restore_best": "Average(Last(10))"}.'),
]  # fmt: skip


def test_a_flag_sent_as_a_string_or_a_number_is_refused_with_the_json_to_send(tmp_path):
    """dry_run='no' once deleted a whole run: every boolean parameter takes a JSON boolean."""
    run = tmp_path / "runs" / "x"
    Nitro(Regression(max_epochs=1, samples=64), run_dir=run).train().close()
    before = sorted(p.name for p in run.iterdir())
    replies = _refusals(tmp_path, [(tool, args) for tool, args, _ in FLAGS])
    for (tool, _, message), (err, text) in zip(FLAGS, replies):
        assert err and text == E.format(tool=tool) + message, text
    assert sorted(p.name for p in run.iterdir()) == before and read_manifest(run)
    assert _jobs(tmp_path) == []


def test_a_restore_best_the_run_can_never_reach_is_refused_at_the_call(tmp_path):
    ((err, text),) = _refusals(tmp_path, [("nitro_train", {
        "experiment": "Classifier", "restore_best": "Average(Last(50))", "overrides": {"max_epochs": 2}})])  # fmt: skip
    assert err and text == E.format(tool="nitro_train") + (
        "restore_best=Average(Last(50)) can never be restored under keep=(Best(3), Last(3)): Last(50) needs 50 "
        "points and a run of max_epochs=2 passes at most 2 (one per epoch end), so the run would end keeping its "
        "final weights. Write restore_best=Average(Last(2)) or train for 50 epochs (max_epochs=50)."
    )  # fmt: skip
    assert _jobs(tmp_path) == []


def test_a_run_that_stops_short_of_its_restore_best_says_so_in_its_status(tmp_path):
    shutil.copy(HERE / "early_stop_experiment.py", tmp_path / "early_stop_experiment.py")

    async def main():
        async with Client(
            build_server(tmp_path, experiment_modules=("early_stop_experiment.py",))
        ) as client:
            err, job = await call(client, "nitro_train", experiment="StopsEarly",
                                  restore_best="Average(Last(5))", overrides={"max_epochs": 9})  # fmt: skip
            assert not err, job
            full = await wait_done(client, job["job_id"])
            _, brief = await call(client, "nitro_status", job_id=job["job_id"], brief=True)
            return full, brief

    full, brief = anyio.run(main)
    run = full["run_id"]
    assert full["state"] == "succeeded" and full["result"]["stop_reason"] == "early_stop", full
    expected = (
        f"Done, but restore_best=Average(Last(5)): run {run} ended before it held enough checkpoints (Cannot "
        f"average '{run} => Average(Last(5))' in '{tmp_path / 'runs/StopsEarly'}': Last(5) needs 5 points and "
        f"the run passed 2 (run {run} holds epochs 1, 2). Average fewer points, or train the run further.); the "
        "handle keeps its final weights. nitro_runs and nitro_manifest show the run's checkpoints; "
        "nitro_validate evaluates one."
    )  # fmt: skip
    assert full["next"] == brief["next"] == expected


def test_a_record_of_another_experiment_or_architecture_is_refused_at_once(trained_root):
    root, status = trained_root
    entries = read_manifest(root / "runs/Classifier")
    last = f"runs/Classifier/{entries[-1].file}"
    before = _jobs(root)
    calls = [
        ("nitro_validate", {"experiment": "Regression", "run_dir": "runs/Classifier", "weights": last}),
        ("average", {"run_dir": "runs/Classifier", "source": "latest => Average(Last(2))", "validate": True,
                     "experiment": "Regression"}),
        ("nitro_train", {"experiment": "Regression", "run_dir": "runs/other", "weights": last, "strict": False}),
        ("nitro_train", {"experiment": "Regression", "run_dir": "runs/Classifier", "resume": "auto"}),
        ("nitro_validate", {"experiment": "Classifier", "weights": last, "overrides": {"hidden": 7}}),
    ]  # fmt: skip
    replies = _refusals(root, calls)
    assert all(err for err, _ in replies) and _jobs(root) == before, replies
    lacks = (
        f"Checkpoint '{last}' does not fit Regression's model: the record lacks '2.weight', '2.bias' and it has "
        "'1.weight', '1.bias', '4.weight', '4.bias', '1.running_mean', '1.running_var' and 1 more that the model "
        "lacks. Build the model the record was written with, or pass strict=false to load the leaves that match "
        "by name (missing ones keep their fresh values, extra ones are dropped). It was written by Classifier, not "
        "Regression: send experiment='Classifier': "
    )  # fmt: skip
    size = "leaf '0.weight' has size [64, 16] in the record and {} in the model."
    assert [text for _, text in replies] == [
        E.format(tool="nitro_validate") + lacks
        + f"nitro_validate(experiment='Classifier', run_dir='runs/Classifier', weights='{last}').",
        E.format(tool="average") + lacks + "average(run_dir='runs/Classifier', source='latest => Average(Last(2))', "
        "validate=true, experiment='Classifier').",
        E.format(tool="nitro_train") + f"Checkpoint '{last}' does not fit Regression's model: "
        + size.format("[32, 8]") + " Build the model the record was written with (same config), or train a new "
        "run. It was written by Classifier, not Regression: send experiment='Classifier': nitro_train("
        f"experiment='Classifier', run_dir='runs/other', weights='{last}', strict=false).",
        E.format(tool="nitro_train") + f"resume='auto' continues run {status['run_id']} in "
        "run_dir='runs/Classifier', which Classifier wrote, not Regression; a resume continues a run under the "
        "experiment that wrote it: send experiment='Classifier': nitro_train(experiment='Classifier', "
        "run_dir='runs/Classifier', resume='auto').",
        E.format(tool="nitro_validate") + f"Checkpoint '{last}' does not fit Classifier's model: "
        + size.format("[7, 16]") + " Build the model the record was written with (same config), or train a new run.",
    ]  # fmt: skip


def test_more_processes_than_the_machine_has_room_for_are_refused(tmp_path, capsys):
    limit, what = process_limit("auto")
    ((err, text),) = _refusals(
        tmp_path, [("nitro_train", {"experiment": "Regression", "nproc": limit + 1})]
    )
    assert err and text == E.format(tool="nitro_train") + (
        f"nproc={limit + 1} is more processes than this machine has room for: {what}. Send nproc from 1 to "
        f"{limit}, e.g. nproc={limit}."
    )
    assert (
        cli(["train", "Regression", "--run-dir", str(tmp_path / "r"), "--nproc", str(limit + 1)])
        == 2
    )
    assert capsys.readouterr().err == (
        f"nitro train: --nproc {limit + 1} is more processes than this machine has room for: {what}; "
        f"e.g. --nproc {limit}.\n"
    )
    assert _jobs(tmp_path) == [] and not (tmp_path / "r").exists()


@pytest.mark.parametrize("name", ["logs", "manifest.json"])
def test_checkpoint_info_on_a_file_that_is_no_record_says_what_it_is(trained_root, name):
    root, status = trained_root
    path = (
        f"runs/Classifier/logs/{status['run_id']}.jsonl"
        if name == "logs"
        else "runs/Classifier/manifest.json"
    )
    what = (
        "a JSONL log (a run's metric history: nitro_history reads it)" if name == "logs"
        else "a run directory's manifest (nitro_manifest reads it)"
    )  # fmt: skip
    ((err, text),) = _refusals(root, [("nitro_checkpoint_info", {"path": path})])
    assert err and text == E.format(tool="nitro_checkpoint_info") + (
        f"path='{path}' is not a Nitro record: it is {what}. Pass a record instead, a .safetensors file or a "
        "record directory (holding header.json); nitro_manifest(run_dir='runs/Classifier') lists its records."
    )
