"""MLflowLogger against a real local MLflow tracking server (its SQLite store, started here
and stopped by its pid, read back with MlflowClient), WandbLogger in W&B's offline mode
(read back from the transaction logs it writes): one tracker run per Nitro run, and a resume
after a stop between a row and its record continues that run, every step once, the series
equal to an uninterrupted run's. Nothing leaves 127.0.0.1."""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import pytest

from nitro_core import ConfigError, JSONLLogger, Nitro, ResumeRefused
from nitro_core.experiment import config_of

from ..tiny import Tiny
from .mlflow_servers import QUIET, server_process

KEYS = ("train_loss", "val/loss", "lr", "epoch")


class Killed(Exception):
    """Stands for a SIGKILL between an epoch's log row and its record."""


def killed_at_epoch(epoch, run_dir, **kw):
    """Train until ``epoch`` has been logged, then die before its record is written."""
    n = Nitro(Tiny(max_epochs=4), run_dir=run_dir, **kw)
    save = n._parts.writer.save

    def dying(e, *args, **kwargs):
        if e == epoch:
            raise Killed
        return save(e, *args, **kwargs)

    n._parts.writer.save = dying
    with pytest.raises(Killed):
        n.train()
    return n


def whole_and_resumed(tmp_path, logger):
    """An uninterrupted run, and one killed after epoch 3's row (steps 4, 8, 12 sent, the
    record at step 8) then resumed to epoch 4."""
    whole = Nitro(Tiny(max_epochs=4), run_dir=tmp_path / "whole", logger=logger).train()
    first = killed_at_epoch(3, tmp_path / "cut", logger=logger)
    resumed = Nitro(Tiny(max_epochs=4), run_dir=tmp_path / "cut", resume="auto", logger=logger)
    assert resumed.run_id == first.run_id and resumed.epoch == 2
    resumed.train()
    assert resumed.logger.ids == first.logger.ids  # the same tracker run
    return whole, first, resumed


@pytest.fixture
def quiet(monkeypatch):
    for key, value in QUIET.items():
        monkeypatch.setenv(key, value)


# -- MLflow ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """``mlflow server`` on a SQLite store and a free port of 127.0.0.1, until the module's
    tests are done; waited for until it answers, stopped by its pid (its process group)."""
    pytest.importorskip("mlflow")
    with server_process(tmp_path_factory.mktemp("mlflow")) as (uri, _):
        yield uri


def _mlflow_series(client, run_id, key):
    return [
        (m.step, m.value)
        for m in sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    ]


@pytest.mark.slow  # the server's start: about 10-20 s on 2 cores
def test_mlflow_resume_after_a_kill_continues_its_run_with_every_step_once(
    tmp_path, mlflow_server, monkeypatch, quiet
):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)  # the standard variables
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "resumed")
    whole, first, resumed = whole_and_resumed(tmp_path, "mlflow")
    client = MlflowClient(mlflow_server)
    a, c = whole.logger.ids["run_id"], resumed.logger.ids["run_id"]
    assert resumed.logger.ids["tracking_uri"] == mlflow_server
    # one MLflow run per Nitro run, named by it
    experiment = client.get_experiment_by_name("resumed")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == sorted([whole.run_id, first.run_id])
    assert client.get_run(c).data.tags["nitro.run_id"] == first.run_id
    assert client.get_run(c).info.status == "FINISHED"
    # every step once, the values an uninterrupted run logs
    assert [s for s, _ in _mlflow_series(client, c, "train_loss")] == [4, 8, 12, 16]
    for key in KEYS:
        assert _mlflow_series(client, c, key) == _mlflow_series(client, a, key), key
    assert [v for _, v in _mlflow_series(client, c, "epoch")] == [1, 2, 3, 4]
    assert _mlflow_series(client, c, "train_loss") == [
        (row["step"], pytest.approx(row["train_loss"])) for row in resumed.history
    ]
    # the config as params, logged once when the run was made
    want = {k: str(v) for k, v in config_of(Tiny(max_epochs=4)).items()}
    assert client.get_run(c).data.params == want == client.get_run(a).data.params


# -- W&B ----------------------------------------------------------------------------------
def _wandb_records(path: Path):
    """W&B's records in a ``.wandb`` transaction log (a 7-byte ':W&B' header, then 32 KiB
    blocks of chunks with 7-byte headers), parsed with W&B's protobuf definitions."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw, out, part = path.read_bytes(), [], b""
    assert raw[:4] == b":W&B"
    for start in range(0, len(raw), 32768):
        block = raw[start : start + 32768]
        at = 7 if start == 0 else 0
        while at + 7 <= len(block):
            _, length, kind = struct.unpack("<IHB", block[at : at + 7])
            if kind == 0:
                break  # padding
            part += block[at + 7 : at + 7 + length]
            at += 7 + length
            if kind in (1, 4):  # full, last
                record = pb.Record()
                record.ParseFromString(part)
                out.append(record)
                part = b""
    return out


def _finished(path: Path):
    """The records of a transaction log once its exit record is written (W&B's service
    writes the log after finish() returns)."""
    deadline = time.monotonic() + 30
    while (records := _wandb_records(path)) == [] or records[-1].WhichOneof(
        "record_type"
    ) != "exit":
        assert time.monotonic() < deadline, f"{path} has no exit record"
        time.sleep(0.05)  # poll again: the state waited for is the exit record written
    return records


def _wandb_run(wandb_dir: Path, run_id: str):
    """(history rows by step in the order written, config, display names) of one W&B run,
    over its offline directories in the order they were made."""
    rows, config, names = [], {}, []
    for d in sorted(wandb_dir.glob(f"wandb/offline-run-*-{run_id}")):
        for record in _finished(d / f"run-{run_id}.wandb"):
            kind = record.WhichOneof("record_type")
            if kind == "history":
                items = {
                    "/".join(i.nested_key) or i.key: json.loads(i.value_json)
                    for i in record.history.item
                }
                rows.append((record.history.step.num, items))
            elif kind == "config":
                config.update({i.key: json.loads(i.value_json) for i in record.config.update})
            elif kind == "run":  # the run's name and its config as created
                names.append(record.run.display_name)
                config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
    return rows, config, names


def test_wandb_offline_resume_after_a_kill_continues_its_run_with_every_step_once(
    tmp_path, monkeypatch, quiet
):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")  # the standard variables
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "nitro-tests")
    whole, first, resumed = whole_and_resumed(tmp_path, "wandb")
    assert resumed.logger.ids["project"] == "nitro-tests"
    a, _, _ = _wandb_run(tmp_path, whole.logger.ids["id"])
    c, config, names = _wandb_run(tmp_path, resumed.logger.ids["id"])
    assert len(list(tmp_path.glob(f"wandb/offline-run-*-{resumed.logger.ids['id']}"))) == 2
    assert set(names) == {first.run_id}
    assert [step for step, _ in c] == [4, 8, 12, 16]  # every step once
    for key in KEYS:
        assert [(s, r[key]) for s, r in c] == [(s, r[key]) for s, r in a], key
    assert [r["epoch"] for _, r in c] == [1, 2, 3, 4]
    assert [(s, r["train_loss"]) for s, r in c] == [
        (row["step"], pytest.approx(row["train_loss"])) for row in resumed.history
    ]
    assert {k: config[k] for k in config_of(Tiny())} == config_of(Tiny(max_epochs=4))


# -- choosing, refusing ---------------------------------------------------------------------
class Recorded(JSONLLogger):
    """A JSONL log recorded under another backend's name: the refusals need only the name."""

    def __init__(self, backend):
        super().__init__()
        self.backend = backend


class Hooked(Tiny):
    def logger(self):
        return Recorded("wandb")


@pytest.mark.parametrize(
    ("recorded", "exp", "choice", "fix"),
    [
        ("mlflow", Tiny, "jsonl",
         "Write Nitro(..., logger='mlflow') (or, without logger=, return MLflowLogger() from "
         "Tiny.logger())"),
        ("wandb", Tiny, None,
         "Write Nitro(..., logger='wandb') (or, without logger=, return WandbLogger() from "
         "Tiny.logger())"),
        ("wandb", Hooked, "tensorboard",
         "Leave logger= out of Nitro(...): Hooked.logger() returns WandbLogger()"),
        ("null", Tiny, "mlflow",
         "Return NullLogger() from Tiny.logger() (without logger=), or pass logger=NullLogger()"),
    ],
)  # fmt: skip
def test_a_resume_under_another_backend_says_which_argument_or_hook_to_change(
    tmp_path, recorded, exp, choice, fix
):
    Nitro(Tiny(max_epochs=1), run_dir=tmp_path, logger=Recorded(recorded)).train()
    with pytest.raises(ResumeRefused) as err:
        Nitro(exp(max_epochs=2), run_dir=tmp_path, resume="auto", logger=choice)
    chosen = choice or "jsonl"
    message = str(err.value)
    assert message.startswith(f"Cannot resume '{tmp_path}/epoch-0001-step-4-")
    assert message.split("': ", 1)[1] == (
        f"its logger state is for the {recorded!r} backend, this handle logs with {chosen!r}: a "
        "resume keeps the run's logger so that its logs continue without gaps or repeats. "
        f"{fix}; or start a new run_dir."
    )


@pytest.mark.parametrize(("name", "package"), [("mlflow", "mlflow"), ("wandb", "wandb")])
def test_without_the_package_the_logger_is_refused_with_how_to_install(
    tmp_path, monkeypatch, name, package
):
    monkeypatch.setitem(sys.modules, package, None)  # import now fails
    with pytest.raises(ConfigError) as err:
        Nitro(Tiny(), run_dir=tmp_path, logger=name)
    cls = {"mlflow": "MLflowLogger", "wandb": "WandbLogger"}[name]
    pin = {"mlflow": "mlflow>=2.14", "wandb": "wandb>=0.17"}[name]
    assert str(err.value) == (
        f"{cls} needs the {package} package, which is not installed: pip install "
        f"'nitro[{name}]' (or pip install '{pin}'). Or log with JSONLLogger() (logger='jsonl')."
    )


def test_a_tracker_logger_sends_nothing_until_a_row(tmp_path, monkeypatch, quiet):
    """A handle that only evaluates makes no tracker run (and so needs no server)."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    Nitro(Tiny(max_epochs=1), run_dir=tmp_path / "a").train()
    weights = str(next((tmp_path / "a").glob("*.safetensors")))
    n = Nitro(Tiny(), run_dir=tmp_path / "b", weights=weights, logger="wandb")
    n.evaluate("val")
    n.close()
    assert n.logger.ids is None and not (tmp_path / "wb").exists()
