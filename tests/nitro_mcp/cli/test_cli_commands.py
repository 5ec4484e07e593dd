"""Every MCP tool has its ``nitro`` command: run against a real small run, a command's
``--json`` is the tool's structured result on the same root, its default output is lines for
a person, and a refusal's hint is written as the command to type (exit status 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import anyio
import pytest
from mcp import Client

from nitro_core import Nitro, NitroWarning, checkpoint_info, read_manifest
from nitro_core.errors import Arg, Call, CheckpointerFix, ConfigError, FieldFix, Lister, Redo
from nitro_core.examples import Regression
from nitro_mcp.cli import main
from nitro_mcp.server import build_server
from nitro_mcp.terminal import TerminalRenderer, for_terminal


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A root holding runs/r: a Regression run of 2 epochs on 64 samples."""
    where = tmp_path_factory.mktemp("cli")
    Nitro(Regression(max_epochs=2, samples=64), run_dir=where / "runs/r").train().close()
    return where


@pytest.fixture
def cli(root, monkeypatch, capsys):
    """``nitro ARGS`` in the root: (exit status, stdout, stderr)."""
    monkeypatch.chdir(root)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def tool(root, tool_name: str, **arguments):
    async def go():
        async with Client(build_server(root)) as client:
            return await client.call_tool(tool_name, arguments)

    return anyio.run(go)


def _latest(root) -> str:
    return f"runs/r/{read_manifest(root / 'runs/r')[-1].file}"


JSON_AS_TOOL = [  # (the command, the tool and its arguments)
    (["runs", "runs/r"], "nitro_runs", {"run_dir": "runs/r"}),
    (["runs"], "nitro_runs", {}),
    (["manifest", "runs/r", "--limit", "20"], "nitro_manifest", {"run_dir": "runs/r"}),
    (["info", "LATEST"], "nitro_checkpoint_info", {"path": "LATEST"}),
    (["verify", "runs/r"], "nitro_verify", {"path": "runs/r"}),
    (["experiments", "Regression"], "nitro_experiments", {"name": "Regression"}),
    (["history", "runs/r", "--last", "1"], "nitro_history", {"run_dir": "runs/r", "last": 1}),
    (["jobs"], "nitro_jobs", {}),
    (["delete", "runs/r"], "nitro_delete", {"run_dir": "runs/r"}),
]


@pytest.mark.parametrize(("argv", "name", "arguments"), JSON_AS_TOOL, ids=lambda x: str(x))
def test_json_output_is_the_tools_structured_result(root, cli, argv, name, arguments):
    latest = _latest(root)
    argv = [latest if a == "LATEST" else a for a in argv]
    arguments = {k: latest if v == "LATEST" else v for k, v in arguments.items()}
    code, out, err = cli(*argv, "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == tool(root, name, **arguments).structured_content


def test_export_writes_what_the_tool_writes(root, cli):
    code, out, err = cli(
        "export", "latest => best", "mine.safetensors", "--run-dir", "runs/r", "--json"
    )
    assert (code, err) == (0, "")
    theirs = tool(root, "nitro_export", source="latest => best", path="theirs.safetensors",
                  run_dir="runs/r").structured_content  # fmt: skip
    mine = json.loads(out)
    assert mine.pop("path") == "mine.safetensors" and theirs.pop("path") == "theirs.safetensors"
    mine.pop("next"), theirs.pop("next")  # each names its own file
    assert mine == theirs
    assert (root / "mine.safetensors").read_bytes() == (root / "theirs.safetensors").read_bytes()


@pytest.mark.slow  # average jobs in worker processes: the slow suite (the default stays under 4 minutes)
def test_average_validate_is_the_tools_average_and_metrics(root, cli):
    from tests.nitro_mcp.conftest import call, ended

    source = "latest => Average(Last(2))"
    code, out, err = cli("average", "runs/r", "--source", source, "--validate",
                         "--save", "runs/mine.safetensors", "--json")  # fmt: skip
    assert (code, err) == (0, "")
    mine = json.loads(out)

    async def go():
        async with Client(build_server(root)) as client:
            reply = await call(client, "average", run_dir="runs/r", source=source,
                               validate=True, save="runs/theirs.safetensors")  # fmt: skip
            return await ended(client, reply, root)

    err, theirs = anyio.run(go)
    assert not err and theirs["state"] == "succeeded"
    assert mine["averaged_from"] == theirs["averaged_from"]
    assert mine["metrics"] == theirs["metrics"] and set(mine["metrics"]) >= {"loss"}
    assert (mine["saved"], theirs["saved"]) == ("runs/mine.safetensors", "runs/theirs.safetensors")
    assert checkpoint_info(root / "runs/mine.safetensors")["metrics"] == mine["metrics"]
    code, out, _ = cli("average", "runs/r", "--source", source, "--validate")
    assert code == 0 and out.splitlines()[-len(mine["metrics"]) :] == [
        f"  {k}: {v:.6g}" for k, v in mine["metrics"].items()
    ]


def test_plot_writes_the_tools_png_and_caption(root, cli):
    pytest.importorskip("matplotlib")
    code, out, err = cli("plot", "runs/r", "--out", "curves.png", "--json")
    assert (code, err) == (0, "")
    mine = json.loads(out)
    theirs = tool(root, "nitro_plot", run_dir="runs/r").content
    run = read_manifest(root / "runs/r")[-1].run
    call = f"nitro_history(run_dir='runs/r', run='{run}')"  # each surface names its own
    assert theirs[1].text.endswith(f"The numbers: {call}.")
    assert mine["caption"] == theirs[1].text.replace(call, f"nitro history runs/r --run {run}")
    assert (root / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_human_output_shows_the_key_lines(root, cli):
    run = read_manifest(root / "runs/r")[-1].run
    code, out, _ = cli("runs", "runs/r")
    assert code == 0 and out.startswith(f"run {run}: 2 checkpoint(s), best loss=")
    assert "[completed]" in out and "      kept by Best(3): #1 by loss (min); Last(1)" in out
    code, out, _ = cli("manifest", "runs/r")
    lines = out.splitlines()
    assert lines[0] == "runs/r: 2 entries" and lines[1].split() == [
        "run", "epoch", "step", "score", "bytes", "file", "stop"
    ]  # fmt: skip
    code, out, _ = cli("history", "runs/r", "--columns", "epoch", "val.loss")
    assert out.splitlines()[:2] == [f"runs/r: run {run}, 2 of 2 row(s)", "epoch  val.loss"]
    code, out, _ = cli("delete", "runs/r")
    assert out.splitlines()[-1] == "Nothing was deleted; add --no-dry-run to delete them."
    assert (root / "runs/r" / read_manifest(root / "runs/r")[0].file).exists()
    code, out, _ = cli("info", _latest(root))
    assert "epoch: 2\n" in out and "rng: (omitted: use `nitro info --full` at a terminal)\n" in out
    code, out, _ = cli("experiments", "Regression")
    assert out.startswith("Regression: ") and "  splits: train, val\n" in out


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["--set", "hidden=abc"], "Write --set hidden=<int> with a value that fits; nitro "
         "experiments Regression lists its fields.\n"),
        (["--set", "hiden=3"], "Write --set naming only those fields, e.g. --set hidden=...; "
         "nitro experiments Regression lists its fields.\n"),
    ],
)  # fmt: skip
def test_a_bad_set_is_answered_with_a_set(cli, argv, hint):
    code, out, err = cli("train", "Regression", "--run-dir", "runs/never", *argv)
    assert (code, out) == (2, "")
    assert err.startswith("nitro train: Regression: ") and err.endswith(hint)
    assert "Regression(field=value)" not in err


def test_a_manifest_hint_names_the_manifest_command(cli):
    code, out, err = cli(
        "validate", "Regression", "--run-dir", "runs/r", "--weights", "runs/r/x.tmp"
    )
    assert (code, out) == (2, "")
    assert err == (
        "nitro validate: 'runs/r/x.tmp' is a partial file left by an interrupted write, never a "
        "checkpoint. Name a committed record instead (nitro manifest runs/r lists them), e.g. "
        "'latest => latest'.\n"
    )


def test_job_and_log_hints_name_the_commands_to_type(root, cli):
    code, out, err = cli("status", "nosuchjob")  # run in the root: no --root to write
    jobs = root / ".nitro" / "jobs"
    assert (code, out) == (2, "")
    assert (
        err
        == f"nitro status: No job 'nosuchjob' under {str(jobs)!r}; nitro jobs lists the jobs there.\n"
    )
    code, out, err = cli("history", "runs/r", "--run", "../x")
    assert (code, out) == (2, "")
    assert err == (
        "nitro history: run='../x' is not a run id; nitro runs runs/r lists the runs, e.g. "
        "--run a1b2c3d4. Leave it out for the latest run.\n"
    )


def test_a_plot_refusal_names_the_options_to_type(cli):
    pytest.importorskip("matplotlib")
    code, out, err = cli("plot", "runs/r", "--metrics", *"abcdefg")
    assert (code, out) == (2, "")
    assert err == (
        "nitro plot: metrics=['a', 'b', 'c', 'd', 'e', 'f', 'g'] must be a list of 1 to 6 column "
        "names, e.g. --metrics train_loss val.loss; leave it out for the loss and val metrics.\n"
    )


def test_a_damaged_records_hint_names_the_manifest_command(root, cli):
    whole = (root / _latest(root)).read_bytes()
    (root / "loose").mkdir(exist_ok=True)
    (root / "loose/short.safetensors").write_bytes(whole[:-100])
    code, out, err = cli("validate", "Regression", "--run-dir", "runs/r", "--weights",
                         "loose/short.safetensors")  # fmt: skip
    assert (code, out) == (1, "")
    assert err == (
        "nitro validate: Checkpoint 'loose/short.safetensors' is truncated: it ends 100 bytes "
        "short of what its header describes. Load another checkpoint (nitro manifest loose "
        "lists them).\n"
    )


def test_exit_status_is_2_for_refused_input_and_1_for_a_failure(root, cli, tmp_path):
    assert cli("manifest", "runs/nope")[0] == 2
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a record")
    code, out, err = cli("verify", str(bad), "--json")
    assert code == 1 and json.loads(out)["ok"] is False and err == ""
    for argv in (["manifest"], ["jobs", "--limit", "0"]):  # a missing argument, the tool's bound
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2


RENDERED = [  # a part -> the words a person types
    (Arg("restore_optimizer", True), "--restore-optimizer"),
    (Arg("strict", False), "--no-strict"),
    (Arg("weights", "latest => best"), "--weights 'latest => best'"),
    (Redo((Arg("weights", "latest => best"), Arg("load_ema", True))),
     "nitro train ... --weights 'latest => best' --load-ema"),
    (Redo(("weights=...",)), "nitro train ... --weights ..."),
    (Call("train", {"experiment": "Regression", "run_dir": "runs/r", "resume": "auto",
                    "overrides": {"max_epochs": 4, "name": "a b"}}),
     "nitro train Regression --run-dir runs/r --resume auto --set max_epochs=4 --set 'name=a b'"),
    (Call("average", {"run_dir": "runs/r", "source": "latest => Average(Last(3))"}),
     "nitro average runs/r --source 'latest => Average(Last(3))'"),
    (CheckpointerFix("keep=Last(3)"),
     "Checkpointer(keep=Last(3)) returned by the experiment's checkpointer() (a change to its module)"),
    (FieldFix("Regression", ("hidden", "lr"), "hidden", "int"),
     "Write --set hidden=<int> with a value that fits; nitro experiments Regression lists its fields."),
    (Lister("runs/my run"), "nitro manifest 'runs/my run'"),
    (Lister(), "nitro manifest RUN_DIR"),
]  # fmt: skip


@pytest.mark.parametrize(("part", "words"), RENDERED, ids=lambda x: str(x)[:40])
def test_each_part_is_written_as_the_command_line_spells_it(part, words):
    assert TerminalRenderer("train").render(part) == words


def test_the_terminal_reads_the_parts_not_the_python_text():
    error = ConfigError("max_epochs: ", FieldFix("Regression", ("hidden",), unknown="hiden"))
    assert str(error) == "max_epochs: Write Regression(field=value) with values that fit."
    assert for_terminal(error, "train") == (
        "max_epochs: Write --set naming only those fields, e.g. --set hidden=...; nitro "
        "experiments Regression lists its fields."
    )


@pytest.mark.slow  # a CLI subprocess: the slow suite (the default stays under 4 minutes)
def test_the_module_runs_as_a_program_with_json_on_stdout_and_nothing_on_stderr(root):
    done = subprocess.run([sys.executable, "-m", "nitro_mcp.cli", "manifest", "runs/r", "--json"],
                          cwd=root, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout)["total"] == 2


def test_compare_json_is_the_tools_result(tmp_path, monkeypatch, capsys):
    for name, lr in (("a", 0.01), ("b", 0.02)):
        n = Nitro(Regression(max_epochs=2, samples=64, lr=lr), run_dir=tmp_path / "runs" / name)
        n.train().close()
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()  # the trainings' progress lines
    code = main(["compare", "runs/a", "runs/b", "--json"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    mine = json.loads(out)
    theirs = tool(tmp_path, "nitro_compare", sources=["runs/a", "runs/b"]).structured_content
    assert mine == theirs and mine["config_diff"]["lr"] == [0.01, 0.02]


def test_compare_at_a_terminal_names_each_branch_its_parent_and_what_it_changed(
    tmp_path, monkeypatch, capsys
):
    a = Nitro(Regression(max_epochs=2, samples=64), run_dir=tmp_path / "runs" / "a")
    a.train().close()
    best = min(read_manifest(tmp_path / "runs" / "a"), key=lambda e: e.score)
    with pytest.warns(NitroWarning, match="trained under another config"):
        b = Nitro(Regression(max_epochs=3, samples=64, lr=0.05), run_dir=tmp_path / "runs" / "b",
                  weights=f"runs/a/{best.file}")  # fmt: skip
    b.train().close()
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["compare", "runs/a", "runs/b"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (
        f"runs/b:{b.run_id} branched from {a.run_id}/{best.file}: max_epochs 2 -> 3, lr 0.01 -> 0.05"
    )
    assert not any(line.startswith(f"runs/a:{a.run_id} branched") for line in out)


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_status_and_stop_of_a_job_are_the_tools_results(tmp_path, monkeypatch, capsys):
    from tests.nitro_mcp.conftest import wait_done

    async def train():
        async with Client(build_server(tmp_path)) as client:
            started = await client.call_tool(
                "nitro_train",
                {"experiment": "Regression", "overrides": {"max_epochs": 2, "samples": 64}},
            )
            job_id = started.structured_content["job_id"]
            await wait_done(client, job_id, limit=600)
            return job_id

    job_id = anyio.run(train)
    monkeypatch.chdir(tmp_path)
    code = main(["status", job_id, "--json"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    mine, theirs = json.loads(out), tool(tmp_path, "nitro_status", job_id=job_id)
    assert mine == theirs.structured_content and mine["state"] == "succeeded"
    code = main(["stop", job_id, "--json"])  # an ended job: refused, as the tool refuses it
    out, err = capsys.readouterr()
    refused = tool(tmp_path, "nitro_stop", job_id=job_id)
    said = f"Job {job_id} already ended (succeeded); there is nothing to stop."
    shown = f"nitro stop: {said} nitro status {job_id} shows its result.\n"  # as typed here
    assert (code, out, err) == (2, "", shown)
    assert refused.is_error and refused.content[0].text == (
        f"Error executing tool nitro_stop: {said} nitro_status shows its result."
    )
    code = main(["status", job_id])
    out, _ = capsys.readouterr()
    assert code == 0 and job_id in out and "succeeded" in out
