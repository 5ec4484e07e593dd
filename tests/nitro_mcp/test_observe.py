"""nitro_history, nitro_plot and nitro_train(logger=...) through a real MCP client: compact
bounded columns from the run's JSONL log, a PNG as image content without structured
content, and a TensorBoard run whose resume continues one event stream."""

from __future__ import annotations

import base64
import io
import json
import os
import sys

import anyio
import pytest
from mcp import Client

from nitro_mcp.server import build_server

from .conftest import call, wait_done

PNG = b"\x89PNG\r\n\x1a\n"


def refused(tool, text):
    """What call() returns for a refusal: the SDK names the tool before the message."""
    return True, f"Error executing tool {tool}: {text}"


def run_tools(root, body, mode="auto"):
    async def main():
        async with Client(build_server(root), mode=mode) as client:
            return await body(client)

    return anyio.run(main)


def write_log(root, run, rows, run_dir="runs/Long"):
    logs = root / run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"{run}.jsonl"
    path.write_text("".join(json.dumps({"run": run, **r}) + "\n" for r in rows))
    return path


def epoch_rows(n, metrics=("loss",)):
    return [
        {
            "epoch": e, "step": 10 * e, "train_loss": 1 / e, "lr": 0.001,
            "val": {m: round(1 / e + k / 7, 6) for k, m in enumerate(metrics)}, "seconds": 0.25,
        }
        for e in range(1, n + 1)
    ]  # fmt: skip


# -- nitro_history ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_history_returns_every_epoch_of_the_latest_run_as_compact_columns(trained_root, mode):
    root, trained = trained_root
    run = trained["run_id"]
    lines = (root / "runs/Classifier/logs" / f"{run}.jsonl").read_text().splitlines()
    logged = [json.loads(line) for line in lines]

    async def body(client):
        result = await client.call_tool("nitro_history", {"run_dir": "runs/Classifier"})
        assert not result.is_error, result.content
        return result

    result = run_tools(root, body, mode)
    reply = result.structured_content
    assert json.loads(result.content[0].text) == reply  # the same reply, as compact text
    assert ": " not in result.content[0].text and "\n" not in result.content[0].text
    assert reply["run"] == run and reply["runs"] == [run] and reply["total_rows"] == 3
    assert reply["columns"] == [
        "epoch", "step", "train_loss", "lr", "val.acc", "val.loss", "seconds",
    ]  # fmt: skip
    assert [r[0] for r in reply["rows"]] == [1, 2, 3]
    for row, line in zip(reply["rows"], logged):
        assert row[1] == line["step"]
        assert row[2] == pytest.approx(line["train_loss"], rel=1e-4)
        assert row[5] == pytest.approx(line["val"]["loss"], rel=1e-4)
    assert reply["next"] == (
        "All 3 rows (epochs 1-3). nitro_plot(run_dir='runs/Classifier') draws them."
    )


def test_a_long_history_is_bounded_by_default_and_says_how_to_see_the_rest(tmp_path):
    write_log(tmp_path, "a1b2c3d4", epoch_rows(2000, ("loss", "acc", "f1", "precision", "recall")))

    async def body(client):
        result = await client.call_tool("nitro_history", {"run_dir": "runs/Long"})
        assert not result.is_error, result.content
        return result

    result = run_tools(tmp_path, body)
    reply = result.structured_content
    assert len(result.content[0].text) < 8000
    assert len(json.dumps(reply)) < 8000
    shown = len(reply["rows"])
    assert 20 < shown < 2000 and reply["total_rows"] == 2000
    assert [r[0] for r in reply["rows"]] == list(range(2001 - shown, 2001))  # the newest
    assert reply["next"] == (
        f"2000 rows (epochs 1-2000); these are the last {shown} of 2000. The whole run "
        f"thinned: nitro_history(run_dir='runs/Long', run='a1b2c3d4', every={-(-2000 // shown)}); "
        "fewer columns fit more rows, e.g. columns=['epoch', 'val.loss']."
    )


def test_a_wide_log_in_a_deep_directory_stays_bounded_and_names_the_columns_left_out(tmp_path):
    deep = "runs/" + "/".join(["a-rather-long-directory-name"] * 12)
    metrics = tuple(f"metric_number_{i}" for i in range(300))
    write_log(tmp_path, "a1b2c3d4", epoch_rows(500, metrics), run_dir=deep)

    async def body(client):
        result = await client.call_tool("nitro_history", {"run_dir": deep})
        assert not result.is_error, result.content
        return result

    result = run_tools(tmp_path, body)
    reply = result.structured_content
    assert len(result.content[0].text) < 8000
    assert reply["columns"][:5] == ["epoch", "step", "train_loss", "lr", "val.metric_number_0"]
    left = 305 - len(reply["columns"])
    assert left > 200 and reply["next"].startswith(
        f"{left} more column(s) (val.metric_number_{len(reply['columns']) - 4}, "
    )
    assert reply["rows"] and reply["rows"][-1][0] == 500


def test_every_thins_rows_ending_at_the_last_and_last_keeps_the_newest(tmp_path):
    write_log(tmp_path, "a1b2c3d4", epoch_rows(100))

    async def body(client):
        _, thinned = await call(client, "nitro_history", run_dir="runs/Long", every=10, last=3)
        _, cols = await call(client, "nitro_history", run_dir="runs/Long", columns=["loss"])
        return thinned, cols

    thinned, cols = run_tools(tmp_path, body)
    assert [r[0] for r in thinned["rows"]] == [80, 90, 100]
    assert thinned["next"] == (
        "100 rows (epochs 1-100); these are 3 of them. Every row: nitro_history("
        "run_dir='runs/Long', run='a1b2c3d4') with every=1 and no last, cut to what fits."
    )
    assert cols["columns"] == ["epoch", "val.loss"]  # 'loss' read as val.loss, epoch kept
    assert cols["rows"][-1] == [100, 0.01] and len(cols["rows"]) == 100


def test_history_picks_a_named_run_or_the_one_that_logged_last(tmp_path):
    old = write_log(tmp_path, "0000aaaa", epoch_rows(2))
    write_log(tmp_path, "1111bbbb", epoch_rows(5))
    os.utime(old, (2e9, 2e9))  # written last

    async def body(client):
        _, latest = await call(client, "nitro_history", run_dir="runs/Long")
        _, named = await call(client, "nitro_history", run_dir="runs/Long", run="1111bbbb")
        return latest, named

    latest, named = run_tools(tmp_path, body)
    assert latest["run"] == "0000aaaa" and latest["total_rows"] == 2
    assert latest["runs"] == ["1111bbbb", "0000aaaa"]
    assert named["run"] == "1111bbbb" and named["total_rows"] == 5


def test_history_skips_lines_that_are_not_rows_and_a_row_still_being_written(tmp_path):
    path = write_log(tmp_path, "a1b2c3d4", epoch_rows(3))
    with open(path, "a") as f:
        f.write("not json\n[1, 2]\n" + '{"epoch": 4, "st')  # a writer mid-row

    async def body(client):
        return await call(client, "nitro_history", run_dir="runs/Long")

    err, reply = run_tools(tmp_path, body)
    assert not err and [r[0] for r in reply["rows"]] == [1, 2, 3]
    assert reply["next"] == (
        "2 line(s) of the log are not JSON rows and were skipped. All 3 rows (epochs 1-3). "
        "nitro_plot(run_dir='runs/Long') draws them."
    )


def test_history_shows_non_finite_values_as_text(tmp_path):
    rows = epoch_rows(2)
    rows[1]["train_loss"] = float("nan")
    write_log(tmp_path, "a1b2c3d4", rows)

    async def body(client):
        return await call(client, "nitro_history", run_dir="runs/Long", columns=["train_loss"])

    err, reply = run_tools(tmp_path, body)
    assert not err and reply["rows"] == [[1, 1.0], [2, "nan"]]


HISTORY_REFUSALS = [
    (
        {"columns": ["val.acc2"]},
        "columns: 'val.acc2' is not a column of run a1b2c3d4; it has epoch, step, train_loss, "
        "lr, val.loss, seconds. Write e.g. columns=['epoch', 'val.loss'].",
    ),
    (
        {"columns": []},
        "columns=[] must be a list of 1 to 50 column names, e.g. columns=['epoch', 'val.loss']; "
        "leave it out for every column.",
    ),
    (
        {"run": "deadbeef"},
        "run='deadbeef' has no metrics log in run_dir='runs/Long' (logs/deadbeef.jsonl); runs "
        "with a log: a1b2c3d4. Write one of those, or leave run out for the latest.",
    ),
    (
        {"run": "../../etc/passwd"},
        "run='../../etc/passwd' is not a run id; nitro_runs(run_dir='runs/Long') lists the runs, "
        "e.g. run='a1b2c3d4'. Leave it out for the latest run.",
    ),
    (
        {"every": 0},
        "every=0 is out of range; give 1 to 100000 (every=2 keeps every second row, ending at "
        "the last).",
    ),
    ({"last": 0}, "last=0 is out of range; give 1 to 100000 (last=50 shows the last 50 rows)."),
]


@pytest.mark.parametrize(("args", "message"), HISTORY_REFUSALS)
def test_history_refusals_name_the_arguments_to_send(tmp_path, args, message):
    write_log(tmp_path, "a1b2c3d4", epoch_rows(3))

    async def body(client):
        return await call(client, "nitro_history", run_dir="runs/Long", **args)

    assert run_tools(tmp_path, body) == refused("nitro_history", message)


def test_history_of_a_directory_without_logs_says_what_to_do(tmp_path):
    (tmp_path / "runs/Empty").mkdir(parents=True)

    async def body(client):
        return await call(client, "nitro_history", run_dir="runs/Empty")

    assert run_tools(tmp_path, body) == refused(
        "nitro_history",
        "run_dir='runs/Empty' holds no metrics log (logs/<run>.jsonl): no run there has "
        "finished an epoch yet. nitro_jobs shows where jobs train; follow one with "
        "nitro_status(job_id=..., wait_s=25, until='end', brief=true).",
    )


def test_a_log_that_is_a_link_is_not_followed(tmp_path):
    outside = tmp_path / "secret.jsonl"
    outside.write_text(json.dumps({"epoch": 1, "step": 1, "secret": 42}) + "\n")
    (tmp_path / "root/runs/Long/logs").mkdir(parents=True)
    link = tmp_path / "root/runs/Long/logs/a1b2c3d4.jsonl"
    link.symlink_to(outside)

    async def body(client):
        return await call(client, "nitro_history", run_dir="runs/Long", run="a1b2c3d4")

    err, text = run_tools(tmp_path / "root", body)
    assert err and "42" not in text
    assert (err, text) == refused(  # a link is not listed as a run's log
        "nitro_history",
        "run='a1b2c3d4' has no metrics log in run_dir='runs/Long' (logs/a1b2c3d4.jsonl); "
        "runs with a log: none. Write one of those, or leave run out for the latest.",
    )


def test_a_logs_directory_linked_out_of_the_run_directory_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere/a1b2c3d4.jsonl").write_text(json.dumps({"epoch": 1}) + "\n")
    (tmp_path / "root/runs/Long").mkdir(parents=True)
    (tmp_path / "root/runs/Long/logs").symlink_to(tmp_path / "elsewhere")

    async def body(client):
        return await call(client, "nitro_history", run_dir="runs/Long")

    assert run_tools(tmp_path / "root", body) == refused(
        "nitro_history",
        f"Refusing to read {str(tmp_path / 'root/runs/Long/logs')!r}: it is a link that leads "
        f"outside the run directory {str(tmp_path / 'root/runs/Long')!r} (or not a directory), "
        "and Nitro reads logs only inside it. Replace the link by a real directory, or remove it.",
    )


# -- nitro_plot --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_plot_returns_a_png_as_image_content_without_structured_content(trained_root, mode):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    root, trained = trained_root

    async def body(client):
        return await client.call_tool("nitro_plot", {"run_dir": "runs/Classifier"})

    result = run_tools(root, body, mode)
    assert not result.is_error and result.structured_content is None
    image, caption = result.content
    assert image.type == "image" and image.mime_type == "image/png"
    png = base64.b64decode(image.data)
    assert png.startswith(PNG) and len(png) < 100_000
    height, width, _ = imread(io.BytesIO(png)).shape
    assert width > 400 and height > 100
    assert caption.type == "text" and caption.text == (
        f"runs/Classifier: run {trained['run_id']} (epochs 1-3). Panels: train_loss, val.acc, "
        f"val.loss. The numbers: nitro_history(run_dir='runs/Classifier', run='{trained['run_id']}')."
    )


def test_plot_draws_several_runs_and_chosen_metrics(tmp_path):
    pytest.importorskip("matplotlib")
    write_log(tmp_path, "0000aaaa", epoch_rows(4))
    write_log(tmp_path, "1111bbbb", epoch_rows(6))

    async def body(client):
        return await client.call_tool(
            "nitro_plot",
            {"run_dir": "runs/Long", "runs": ["0000aaaa", "1111bbbb"], "metrics": ["loss"]},
        )

    result = run_tools(tmp_path, body)
    assert not result.is_error and base64.b64decode(result.content[0].data).startswith(PNG)
    assert result.content[1].text.startswith(
        "runs/Long: run 0000aaaa (epochs 1-4); run 1111bbbb (epochs 1-6). Panels: val.loss."
    )


PLOT_REFUSALS = [
    (
        {"metrics": ["acc"]},
        "metrics: 'acc' is not a column of run a1b2c3d4; it has epoch, step, train_loss, lr, "
        "val.loss, seconds. Write e.g. metrics=['train_loss', 'val.loss'].",
    ),
    (
        {"runs": []},
        "runs=[] must be a list of 1 to 8 run ids, e.g. runs=['a1b2c3d4']; "
        "nitro_runs(run_dir='runs/Long') lists them. Leave it out for the latest run.",
    ),
    (
        {"runs": ["ffff0000"]},
        "runs='ffff0000' has no metrics log in run_dir='runs/Long' (logs/ffff0000.jsonl); runs "
        "with a log: a1b2c3d4. Write one of those, or leave runs out for the latest.",
    ),
]


@pytest.mark.parametrize(("args", "message"), PLOT_REFUSALS)
def test_plot_refusals_name_the_arguments_to_send(tmp_path, args, message):
    pytest.importorskip("matplotlib")
    write_log(tmp_path, "a1b2c3d4", epoch_rows(3))

    async def body(client):
        return await call(client, "nitro_plot", run_dir="runs/Long", **args)

    assert run_tools(tmp_path, body) == refused("nitro_plot", message)


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch):
    write_log(tmp_path, "a1b2c3d4", epoch_rows(3))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails

    async def body(client):
        return await call(client, "nitro_plot", run_dir="runs/Long")

    assert run_tools(tmp_path, body) == refused(
        "nitro_plot",
        "nitro_plot needs matplotlib, which is not installed where the server runs: pip install "
        "'nitro[plot]' (or pip install 'matplotlib>=3.7'), then restart the server. "
        "nitro_history gives the same numbers as text.",
    )


# -- nitro_train(logger=...) ---------------------------------------------------------------------
@pytest.mark.slow  # a real worker end to end; `pytest -m slow`
def test_a_tensorboard_run_resumes_with_its_logger_and_continues_one_event_stream(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    fast = {"max_epochs": 2, "samples": 128}

    async def body(client):
        err, job = await call(client, "nitro_train", experiment="Classifier", overrides=fast,
                              logger="tensorboard")  # fmt: skip
        assert not err, job
        first = await wait_done(client, job["job_id"])
        assert first["state"] == "succeeded", first
        more = {**fast, "max_epochs": 3}
        refused = await call(client, "nitro_train", experiment="Classifier", resume="auto",
                             overrides=more, logger="jsonl")  # fmt: skip
        err, job = await call(client, "nitro_train", experiment="Classifier", resume="auto",
                              overrides=more, logger="tensorboard")  # fmt: skip
        assert not err, job
        second = await wait_done(client, job["job_id"])
        assert second["state"] == "succeeded", second
        _, hist = await call(client, "nitro_history", run_dir="runs/Classifier")
        return first, refused, hist

    first, refused, hist = run_tools(tmp_path, body)
    run = first["run_id"]
    assert refused[0] and refused[1].startswith(
        "Error executing tool nitro_train: resume='auto' continues 'epoch-0002-step-"
    )
    assert refused[1].endswith(
        "whose logger state is for the 'tensorboard' backend, but this call logs with 'jsonl': "
        "a resume keeps the run's logger so that its logs continue without gaps or repeats. "
        "Set logger='tensorboard': send nitro_train(experiment='Classifier', run_dir='runs/Classifier', resume='auto', "
        "overrides={'max_epochs': 3, 'samples': 128}, logger='tensorboard')."
    )
    acc = EventAccumulator(str(tmp_path / "runs/Classifier/logs/tb" / run))
    acc.Reload()
    assert [e.value for e in acc.Scalars("epoch")] == [1, 2, 3]
    assert hist["run"] == run and [r[0] for r in hist["rows"]] == [1, 2, 3]  # JSONL kept too


@pytest.mark.parametrize(
    ("logger", "message"),
    [
        (
            "tb",
            "logger='tb' is not a logger; send logger='jsonl', 'tensorboard' (event files in "
            "<run_dir>/logs/tb/<run>/, beside the JSONL log), 'mlflow' or 'wandb' (an MLflow or "
            "W&B run, set by MLFLOW_TRACKING_URI or WANDB_MODE, WANDB_PROJECT where the server "
            "runs), or leave it out for the experiment's own logger().",
        ),
    ],
)
def test_nitro_train_refuses_an_unknown_logger(tmp_path, logger, message):
    async def body(client):
        return await call(client, "nitro_train", experiment="Classifier", logger=logger)

    assert run_tools(tmp_path, body) == refused("nitro_train", message)


def test_nitro_train_with_tensorboard_missing_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)

    async def body(client):
        return await call(client, "nitro_train", experiment="Classifier", logger="tensorboard")

    assert run_tools(tmp_path, body) == refused(
        "nitro_train",
        "logger='tensorboard' needs the tensorboard package where the server runs: pip install "
        "'nitro[tensorboard]' there and restart the server, or send logger='jsonl'.",
    )
    assert not (tmp_path / ".nitro/jobs").exists() or not list((tmp_path / ".nitro/jobs").iterdir())


def test_cli_train_takes_a_logger(tmp_path):
    pytest.importorskip("tensorboard")
    from nitro_mcp.cli import main

    code = main(["train", "Classifier", "--run-dir", "runs/C", "--set", "max_epochs=1",
                 "--set", "samples=64", "--logger", "tensorboard"])  # fmt: skip
    assert code == 0
    assert list((tmp_path / "runs/C/logs/tb").glob("*/events.out.tfevents.*"))


@pytest.mark.parametrize("logger", ["mlflow", "wandb"])
def test_nitro_train_with_a_tracker_missing_says_how_to_install_it(tmp_path, monkeypatch, logger):
    monkeypatch.setitem(sys.modules, logger, None)

    async def body(client):
        return await call(client, "nitro_train", experiment="Classifier", logger=logger)

    assert run_tools(tmp_path, body) == refused(
        "nitro_train",
        f"logger='{logger}' needs the {logger} package where the server runs: pip install "
        f"'nitro[{logger}]' there and restart the server, or send logger='jsonl'.",
    )
