"""schemas/ matches the server and the models; the CLI's terminal commands work."""

from __future__ import annotations

import json
from pathlib import Path

from nitro_core import Nitro, checkpoint_info, read_manifest
from nitro_core.examples import Classifier
from nitro_core.state.header import RecordHeader
from nitro_mcp.cli import main
from nitro_mcp.schemas import generate

REPO = Path(__file__).resolve().parents[2]


def test_committed_schemas_match_the_server_and_models():
    generated = generate()
    on_disk = {
        str(p.relative_to(REPO / "schemas")): json.loads(p.read_text())
        for p in (REPO / "schemas").rglob("*.json")
    }
    assert set(on_disk) == set(generated), "run `nitro schemas` and commit schemas/"
    for name, schema in generated.items():
        assert on_disk[name] == json.loads(json.dumps(schema)), (
            f"{name} drifted: run `nitro schemas`"
        )


def test_every_record_header_validates_against_the_header_schema(tmp_path):
    from nitro_core import average_checkpoints

    Nitro(Classifier(max_epochs=3, samples=256), run_dir=tmp_path).train()
    for e in read_manifest(tmp_path):
        RecordHeader.model_validate(checkpoint_info(tmp_path / e.file))
    average_checkpoints(tmp_path, "latest => Average(Last(2))", save=tmp_path / "avg.safetensors")
    RecordHeader.model_validate(checkpoint_info(tmp_path / "avg.safetensors"))


def test_cli_train_runs_info_manifest_and_average(tmp_path, capsys):
    run = str(tmp_path / "r")
    assert (
        main(
            [
                "train",
                "Regression",
                "--run-dir",
                run,
                "--set",
                "max_epochs=2",
                "--set",
                "samples=128",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in out.splitlines()]  # stdout: JSON lines only
    assert [r["epoch"] for r in rows] == [1, 2]
    assert err.endswith(f"in {run}: completed at epoch 2\n")  # the prose goes to stderr
    assert main(["runs", run]) == 0
    assert "[completed]" in capsys.readouterr().out
    entries = read_manifest(run)
    assert main(["info", f"{run}/{entries[-1].file}", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["header"]
    assert info["epoch"] == 2 and info["rng"].startswith("(omitted")
    assert main(["manifest", run, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["entries"]
    assert [e["file"] for e in listed] == [e.file for e in entries]
    assert main(["average", run, "--source", "latest => Average(Last(2))", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["averaged_from"]["epochs"] == [1, 2]
    assert main(["average", run, "--source", "latest => Average(Last(5))"]) == 2  # refused
    assert "Last(5) needs 5 points and the run passed 2" in capsys.readouterr().err
    assert main(["validate", "Regression", "--run-dir", run, "--set", "samples=128", "--json"]) == 0
    repeated = json.loads(capsys.readouterr().out)["metrics"]
    assert main(["validate", "Regression", "--run-dir", run, "--json"]) == 0  # the record's config
    assert json.loads(capsys.readouterr().out)["metrics"] == repeated


def test_cli_reports_a_refusal_on_stderr_with_status_2(tmp_path, capsys):
    assert main(["train", "Nope", "--run-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("nitro train: Unknown experiment 'Nope'")


def test_cli_refuses_a_run_directory_that_does_not_exist_or_is_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for command in (["manifest"], ["runs"], ["average"]):
        for given, why in (
            (str(tmp_path / "nope"), "does not exist; give an existing run directory, e.g. "
             "runs/Classifier (the run_dir a training wrote to)."),
            (str(tmp_path / "file"), "is a file, not a directory; give a run directory, e.g. "
             "runs/Classifier."),
        ):  # fmt: skip
            assert main([*command, given]) == 2, command
            out, err = capsys.readouterr()
            assert out == "" and err == f"nitro {command[0]}: {given!r} {why}\n"
