"""The record's config is the default (issue 10, item 1): validating and averaging with
validation build the experiment from the record's config, the call's overrides on top and
each difference named in a warning; a resume takes the recorded config and lets overrides
change Host fields only, refusing a plain-field change with the calls to send instead."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client

from nitro_core import Nitro, read_manifest
from nitro_core.examples import Regression
from nitro_mcp.server import build_server

from .conftest import call, ended, wait_done

E = "Error executing tool {tool}: "
WIDE = {"hidden": 16, "samples": 256, "max_epochs": 2}  # away from Classifier's defaults


def _jobs(root):
    store = root / ".nitro" / "jobs"
    return sorted(p.name for p in store.iterdir()) if store.exists() else []


@pytest.fixture(scope="module")
def wide_root(tmp_path_factory):
    """A Classifier run trained with hidden=16 and samples=256 (written in-process)."""
    root = tmp_path_factory.mktemp("wide")
    from nitro_core.examples import Classifier

    Nitro(Classifier(**WIDE), run_dir=root / "runs/Classifier").train()
    return root


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_validate_without_overrides_reproduces_the_recorded_metrics(trained_root):
    root, trained = trained_root

    async def main():
        async with Client(build_server(root)) as client:
            return await ended(client, await call(
                client, "nitro_validate", experiment="Classifier", weights="latest => latest"
            ))  # fmt: skip

    err, val = anyio.run(main)
    assert not err and val["state"] == "succeeded", val
    assert val["metrics"] == trained["result"]["final_val"] and val["warnings"] == []


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_each_override_that_differs_from_the_record_is_named_in_a_warning(trained_root):
    root, _ = trained_root

    async def main():
        async with Client(build_server(root)) as client:
            return await ended(client, await call(
                client, "nitro_validate", experiment="Classifier",
                overrides={"batch_size": 32, "samples": 256},
            ))  # fmt: skip

    err, val = anyio.run(main)
    assert not err and val["state"] == "succeeded", val
    assert val["warnings"] == ["overrides change batch_size: 64 (record) -> 32 (call)"]


@pytest.mark.slow  # 10 s: two trainings and a validation through jobs; the default suite stays under 4 min
def test_a_model_trained_away_from_the_defaults_validates_and_averages_as_recorded(wide_root):
    recorded = read_manifest(wide_root / "runs/Classifier")[-1]

    async def main():
        async with Client(build_server(wide_root)) as client:
            err, val = await ended(client, await call(
                client, "nitro_validate", experiment="Classifier", weights="latest => latest"
            ))  # fmt: skip
            assert not err and val["state"] == "succeeded", val
            assert val["metrics"]["acc"] == recorded.score and val["warnings"] == []
            err, avg = await ended(client, await call(
                client, "average", run_dir="runs/Classifier",
                source="latest => Average(Last(1))", validate=True, split="test",
                overrides={"batch_size": 128},
            ))  # fmt: skip
            assert not err and avg["state"] == "succeeded", avg
            assert set(avg["metrics"]) == {"acc", "loss"}  # the test split, on hidden=16
            assert avg["warnings"] == ["overrides change batch_size: 64 (record) -> 128 (call)"]

    anyio.run(main)


def test_overrides_and_split_on_an_average_without_validation_are_refused(wide_root):
    before = _jobs(wide_root)

    async def main():
        async with Client(build_server(wide_root, max_jobs=0)) as client:
            return await call(
                client, "average", run_dir="runs/Classifier", source="latest => Average(Last(2))",
                overrides={"hidden": 16}, split="test",
            )  # fmt: skip

    err, text = anyio.run(main)
    assert err and text == E.format(tool="average") + (
        "overrides={'hidden': 16}, split='test' apply only to the validation of the average; "
        "add validate=true: average(run_dir='runs/Classifier', source='latest => "
        "Average(Last(2))', validate=true, overrides={'hidden': 16}, split='test'), or drop "
        "overrides and split."
    )
    assert _jobs(wide_root) == before  # refused before any job existed


@pytest.fixture
def small_run(tmp_path):
    """A Regression run of one epoch under hidden=8, samples=64, written in-process."""
    Nitro(
        Regression(max_epochs=1, samples=64, hidden=8), run_dir=tmp_path / "runs/Regression"
    ).train()
    return tmp_path, read_manifest(tmp_path / "runs/Regression")[-1].run


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_resume_auto_takes_the_recorded_config_without_repeating_it(small_run):
    root, run = small_run

    async def main():
        async with Client(build_server(root)) as client:
            err, job = await call(
                client, "nitro_train", experiment="Regression", resume="auto",
                overrides={"max_epochs": 2},
            )  # fmt: skip
            assert not err, job
            return await wait_done(client, job["job_id"])

    done = anyio.run(main)
    assert done["state"] == "succeeded", done
    assert done["result"]["run_id"] == run and done["epoch"] == 2
    assert done["result"]["warnings"][0] == "overrides change max_epochs: 1 (record) -> 2 (call)"


def test_a_plain_field_override_on_a_resume_is_refused_with_the_calls_to_send(small_run):
    root, run = small_run

    async def main():
        async with Client(build_server(root, max_jobs=0)) as client:
            refused = await call(
                client, "nitro_train", experiment="Regression", resume="auto",
                overrides={"hidden": 16, "samples": 64, "max_epochs": 3},
            )  # fmt: skip
            # the resume the refusal names is accepted as it stands; a branch that cannot load is not named
            err, resumed = await call(
                client, "nitro_train", experiment="Regression", run_dir="runs/Regression",
                resume="auto", overrides={"samples": 64, "max_epochs": 3},
            )  # fmt: skip
            assert not err, resumed
            await call(client, "nitro_stop", job_id=resumed["job_id"])
            return refused

    err, text = anyio.run(main)
    file = read_manifest(small_run[0] / "runs/Regression")[-1].file
    assert err and text == E.format(tool="nitro_train") + (
        f"resume='auto' continues run {run} under its recorded config; overrides may change "
        "only Host fields (max_epochs), and these change plain fields: hidden: 8 (record) -> 16 "
        "(call). Drop overrides={'hidden': 16} to resume: nitro_train(experiment='Regression', "
        "run_dir='runs/Regression', resume='auto', overrides={'samples': 64, 'max_epochs': 3}), "
        "a new run from its weights would not load them under these overrides: Checkpoint "
        f"'runs/Regression/{file}' does not fit Regression's model: leaf '0.weight' has size [8, 8] in the record "
        "and [16, 8] in the model. Build the model the record was written with (same config), or "
        "train a new run."
    )
