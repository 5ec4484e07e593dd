"""A tracker is a side channel: one that does not answer at setup refuses a fresh run
(``ConfigError`` naming where it was asked and what to do) and lets a resume go on with a
warning; one that stops answering mid-run costs one bounded wait and one warning, training
goes on with every row in the JSONL log, and a resume once it answers again sends it the
rows it missed. MLflow's own server app on 127.0.0.1 (served from a thread, stopped and
started again on its port; and, slow, ``mlflow server`` killed by its pid), W&B without
credentials or server. Nothing leaves 127.0.0.1."""

from __future__ import annotations

import contextlib
import threading
import warnings

import pytest

from nitro_core import ConfigError, MLflowLogger, Nitro, NitroWarning
from nitro_core.store.metrics_log import read_log

from ..tiny import Tiny
from .mlflow_servers import QUIET, AppServer, free_port, kill, server_process, silent_listener

TIMEOUT = "NITRO_TRACKER_TIMEOUT_S"
NO_ANSWER = f"no answer within 5 s ({TIMEOUT})"  # what a call that times out says


@pytest.fixture
def quiet(monkeypatch):
    for key, value in QUIET.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(TIMEOUT, "5")  # a healthy call takes milliseconds


@pytest.fixture(scope="module")
def mlflow_app(tmp_path_factory):
    """MLflow's server app on a SQLite store of this module (its handlers open the store
    that the environment names, once), warmed up: the store's tables made."""
    pytest.importorskip("mlflow")
    from mlflow.server import ARTIFACT_ROOT_ENV_VAR, BACKEND_STORE_URI_ENV_VAR, app
    from mlflow.tracking import MlflowClient, set_tracking_uri

    root = tmp_path_factory.mktemp("mlflow-app")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(BACKEND_STORE_URI_ENV_VAR, f"sqlite:///{root / 'mlflow.db'}")
        mp.setenv(ARTIFACT_ROOT_ENV_VAR, str(root / "artifacts"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)  # put back at the end
        for key, value in QUIET.items():
            mp.setenv(key, value)
        server = AppServer(app).start()
        MlflowClient(server.uri).search_experiments(max_results=1)
        server.stop()
        # opening its store, the app made it this process's tracking URI: undone
        set_tracking_uri(None)
        yield app


def nitro_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, NitroWarning)]


def log_of(n):
    return f"{n.run_dir}/logs/{n.run_id}.jsonl"


def series(uri, run_id, key="train_loss"):
    from mlflow.tracking import MlflowClient

    history = MlflowClient(uri).get_metric_history(run_id, key)
    return [(m.step, m.value) for m in sorted(history, key=lambda m: (m.step, m.timestamp))]


def train_within(n, seconds, **kw):
    """``n.train(**kw)`` on a thread: a safety net, so that a tracker that blocks training
    fails the test instead of hanging it (the state waited for is the end of train())."""
    failure = []

    def run():
        try:
            n.train(**kw)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"train() still blocked after {seconds} s"
    if failure:
        raise failure[0]


# -- at setup -----------------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["closed", "hung"])
def test_a_fresh_run_is_refused_when_its_tracking_server_does_not_answer(
    tmp_path, monkeypatch, quiet, fault
):
    pytest.importorskip("mlflow")
    monkeypatch.setenv(TIMEOUT, "0.5")  # what is waited for is the refusal, however late
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the standard variable
    with silent_listener(port) if fault == "hung" else contextlib.nullcontext():
        with pytest.raises(ConfigError) as err:
            Nitro(Tiny(), run_dir=tmp_path / "run", logger="mlflow")
    why = {"closed": "connection refused", "hung": f"no answer within 0.5 s ({TIMEOUT})"}
    assert str(err.value) == (
        f"MLflowLogger cannot reach the MLflow tracking server at {uri}: {why[fault]}. Start "
        "the server, or point MLFLOW_TRACKING_URI (or MLflowLogger(tracking_uri=...)) at one "
        "that answers; or log with JSONLLogger() (logger='jsonl')."
    )
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").rglob("*.jsonl"))


@pytest.mark.parametrize("value", ["soon", "0", "-2", "nan", "inf"])
def test_the_tracker_timeout_is_a_positive_number_of_seconds(tmp_path, monkeypatch, value):
    pytest.importorskip("mlflow")
    monkeypatch.setenv(TIMEOUT, value)
    with pytest.raises(ConfigError) as err:
        Nitro(Tiny(), run_dir=tmp_path, logger=MLflowLogger(f"sqlite:///{tmp_path}/m.db"))
    assert str(err.value) == (
        f"{TIMEOUT}={value!r} is not a number of seconds: it bounds each call to an experiment "
        f"tracker. Set it to a positive number such as {TIMEOUT}=30, or unset it for the "
        "default (10)."
    )


@pytest.fixture
def wandb_online(tmp_path, monkeypatch, quiet):
    """W&B online, with no credentials here and a server URL where nothing listens; W&B
    reads its environment once per session, so the session starts here and ends after."""
    wandb = pytest.importorskip("wandb")
    for key in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(key, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NETRC", str(home / ".netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / "wandb-config"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_MODE", "online")
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("WANDB_BASE_URL", url)
    wandb.teardown()
    yield url
    wandb.teardown()


OFFLINE = (
    "log offline with WANDB_MODE=offline (or WandbLogger(mode='offline')) and upload later "
    "with `wandb sync`"
)


def test_wandb_online_without_credentials_is_refused_at_setup_saying_what_to_do(
    tmp_path, wandb_online
):
    with pytest.raises(ConfigError) as err:
        Nitro(Tiny(), run_dir=tmp_path / "run", logger="wandb")
    assert str(err.value) == (
        f"WandbLogger logs online to {wandb_online}, but no W&B credentials are configured "
        f"here. Run `wandb login` (or set WANDB_API_KEY), or {OFFLINE}; or log with "
        "JSONLLogger() (logger='jsonl')."
    )
    assert not (tmp_path / "wb").exists()  # no W&B run was started


def test_wandb_online_with_credentials_it_refuses_is_refused_at_setup_saying_what_to_do(
    tmp_path, monkeypatch, wandb_online
):
    monkeypatch.setenv("WANDB_API_KEY", "short")
    with pytest.raises(ConfigError) as err:
        Nitro(Tiny(), run_dir=tmp_path / "run", logger="wandb")
    said = str(err.value)
    assert said.startswith(
        f"WandbLogger logs online to {wandb_online}, but W&B refuses its credentials: "
        "AuthenticationError: "
    )  # then W&B's own words, which change with its version
    assert said.endswith(
        f". Run `wandb login` (or set WANDB_API_KEY), or {OFFLINE}; or log with JSONLLogger() "
        "(logger='jsonl')."
    )
    assert ".." not in said


def test_wandb_online_without_its_server_is_refused_at_setup_saying_what_to_do(
    tmp_path, monkeypatch, wandb_online
):
    monkeypatch.setenv("WANDB_API_KEY", "0123456789" * 4)  # credentials, never checked here
    with pytest.raises(ConfigError) as err:
        Nitro(Tiny(), run_dir=tmp_path / "run", logger="wandb")
    assert str(err.value) == (
        f"WandbLogger cannot reach the W&B server at {wandb_online}: connection refused. Point "
        f"WANDB_BASE_URL at a server that answers, or {OFFLINE}; or log with JSONLLogger() "
        "(logger='jsonl')."
    )


# -- mid-run ------------------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["killed", "hung"])
def test_a_tracking_server_that_stops_answering_mid_run_costs_one_wait_and_one_warning(
    tmp_path, mlflow_app, quiet, fault
):
    server = AppServer(mlflow_app).start()
    with contextlib.ExitStack() as stack:

        def stop_after_epoch_2(row):  # its row sent and its record written
            if row["epoch"] == 2:
                server.stop()  # its port closed: a connection is refused
                if fault == "hung":  # a connection opens, and waits
                    stack.enter_context(silent_listener(server.port))

        n = Nitro(Tiny(max_epochs=4), run_dir=tmp_path, logger=MLflowLogger(server.uri))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train_within(n, 60, on_epoch=stop_after_epoch_2)
    ids = n.logger.ids
    # training went on: every epoch trained, recorded and in the JSONL log
    assert n.epoch == 4 and [r["step"] for r in n.history] == [4, 8, 12, 16]
    assert [r["step"] for r in read_log(tmp_path, n.run_id).rows] == [4, 8, 12, 16]
    # said once, with where the rows are and what a resume does
    assert nitro_warnings(caught) == [
        f"MLflow at {server.uri} failed at step 12 (sending the row: {NO_ANSWER}). Run "
        f"{n.run_id} goes on without it; every row is in {log_of(n)}. A resume once MLflow "
        f"answers again continues its run {ids['run_id']} with the rows it missed."
    ]
    # the records keep the MLflow run; it holds what was sent before the stop
    assert n.logger.state()["mlflow"] == ids and ids["tracking_uri"] == server.uri
    reader = AppServer(mlflow_app).start()
    try:
        assert [s for s, _ in series(reader.uri, ids["run_id"])] == [4, 8]
    finally:
        reader.stop()


def test_a_resume_without_its_tracking_server_goes_on_and_sends_what_it_missed_once_back(
    tmp_path, mlflow_app, quiet
):
    server = AppServer(mlflow_app).start()
    first = Nitro(Tiny(max_epochs=2), run_dir=tmp_path, logger=MLflowLogger(server.uri)).train()
    ids = first.logger.ids
    server.stop()
    # gone: the resume goes on, said once; the records keep the MLflow run
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gone = Nitro(Tiny(max_epochs=4), run_dir=tmp_path, resume="auto", logger="mlflow")
        train_within(gone, 60)
    assert nitro_warnings(caught) == [
        f"MLflowLogger cannot reach the MLflow tracking server at {server.uri}: connection "
        f"refused. Run {first.run_id} resumes without MLflow; every row is in {log_of(first)}. "
        f"A resume once MLflow answers again continues its run {ids['run_id']} with the rows "
        "it missed."
    ]
    assert gone.run_id == first.run_id and gone.epoch == 4
    assert [r["epoch"] for r in read_log(tmp_path, first.run_id).rows] == [1, 2, 3, 4]
    # back: the next resume continues that MLflow run, the rows it missed first
    server.start()  # on the same port
    try:
        back = Nitro(Tiny(max_epochs=6), run_dir=tmp_path, resume="auto", logger="mlflow")
        assert back.logger.ids == ids  # read from the record the resume without it wrote
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            back.train()
        assert nitro_warnings(caught) == []
        rows = read_log(tmp_path, first.run_id).rows
        assert [r["step"] for r in rows] == [4, 8, 12, 16, 20, 24]
        assert series(server.uri, ids["run_id"]) == [
            (r["step"], pytest.approx(r["train_loss"])) for r in rows
        ]  # every step once
        assert series(server.uri, ids["run_id"], "epoch") == [(4 * e, e) for e in range(1, 7)]
    finally:
        server.stop()


# -- a real server process, killed ----------------------------------------------------------
@pytest.mark.slow  # the server's start: about 10-20 s on 2 cores
def test_an_mlflow_server_killed_mid_run_leaves_training_and_its_resume_going(tmp_path, quiet):
    pytest.importorskip("mlflow")
    with server_process(tmp_path) as (uri, process):

        def kill_after_epoch_2(row):
            if row["epoch"] == 2:
                kill(process)

        n = Nitro(Tiny(max_epochs=4), run_dir=tmp_path / "run", logger=MLflowLogger(uri))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train_within(n, 60, on_epoch=kill_after_epoch_2)
        ids = n.logger.ids
        assert [r["epoch"] for r in read_log(tmp_path / "run", n.run_id).rows] == [1, 2, 3, 4]
        assert nitro_warnings(caught) == [
            f"MLflow at {uri} failed at step 12 (sending the row: {NO_ANSWER}). Run "
            f"{n.run_id} goes on without it; every row is in {log_of(n)}. A resume once "
            f"MLflow answers again continues its run {ids['run_id']} with the rows it missed."
        ]
        # a resume while it is gone goes on, warned, and keeps the MLflow run
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed = Nitro(
                Tiny(max_epochs=6), run_dir=tmp_path / "run", resume="auto", logger="mlflow"
            )
            train_within(resumed, 60)
        assert nitro_warnings(caught) == [
            f"MLflowLogger cannot reach the MLflow tracking server at {uri}: connection "
            f"refused. Run {n.run_id} resumes without MLflow; every row is in {log_of(n)}. A "
            f"resume once MLflow answers again continues its run {ids['run_id']} with the rows "
            "it missed."
        ]
        assert resumed.logger.ids == ids and resumed.logger.state()["mlflow"] == ids
        assert [r["epoch"] for r in read_log(tmp_path / "run", n.run_id).rows] == list(range(1, 7))
