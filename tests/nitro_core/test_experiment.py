"""Experiments are frozen pydantic models; setup refuses a bad one by naming the field or hook."""

from __future__ import annotations

import pytest
import torch

from nitro_core import (
    ConfigError,
    Experiment,
    Host,
    MissingHookError,
    Nitro,
    read_manifest,
)
from nitro_core.examples import Classifier, Regression
from nitro_core.experiment import changed_fields, config_diff, config_of, host_fields

from .tiny import Tiny


def test_experiments_are_frozen():
    exp = Regression()
    with pytest.raises(Exception, match="frozen"):
        exp.hidden = 3


def test_host_fields_are_marked():
    assert host_fields(Regression) == {"max_epochs"}
    assert host_fields(Classifier) == {"max_epochs", "ema_decay"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"hidden": "wide"},
            "Regression: field 'hidden' expects int, got 'wide' (str): Input should be a valid integer. "
            "Write Regression(field=value) with values that fit.",
        ),
        (
            {"hiden": 3},
            "Regression: unknown field 'hiden'; Regression has the fields: max_epochs, features, hidden, "
            "samples, batch_size, lr. Write Regression(field=value) with values that fit.",
        ),
        (
            {"max_epochs": 0},
            "Regression: field 'max_epochs' expects int, got 0 (int): Value error, max_epochs must be at least 1. "
            "Write Regression(field=value) with values that fit.",
        ),
    ],
)
def test_a_config_value_of_the_wrong_type_is_refused_naming_the_field(kwargs, message):
    with pytest.raises(ConfigError) as exc:
        Regression(**kwargs)
    assert str(exc.value) == message


class NoModel(Experiment):
    def build_data(self):
        return {"train": []}

    def loss(self, model, batch):
        return torch.zeros(())


class NoTrain(Tiny):
    def build_data(self):
        return {"training": [], "val": []}


def test_a_missing_required_hook_is_refused_at_setup_naming_it():
    with pytest.raises(MissingHookError) as exc:
        Nitro(NoModel())
    assert str(exc.value) == (
        "NoModel does not define the required hook build_model. "
        "Add to class NoModel: def build_model(self): return torch.nn.Linear(...)"
    )


def test_a_missing_train_split_is_refused_at_setup():
    with pytest.raises(ConfigError) as exc:
        Nitro(NoTrain())
    assert str(exc.value) == (
        "NoTrain.build_data() returned the splits ['training', 'val'] without 'train'; return "
        "{'train': ..., 'val': ...} ('train' is required to train, 'val' enables ranking)."
    )


def test_config_diff_ignores_host_fields_and_accepts_new_fields_at_their_default():
    recorded = Regression(hidden=32, max_epochs=2).model_dump(mode="json")
    assert config_diff(recorded, Regression(hidden=32, max_epochs=9)) == []
    assert config_diff(recorded, Regression(hidden=64)) == ["  hidden: 32 -> 64"]
    del recorded["lr"]
    assert config_diff(recorded, Regression()) == []
    assert config_diff(recorded, Regression(lr=0.5)) == [
        "  lr: (not in the record; compatible only at its default 0.01) -> 0.5"
    ]


class WithHost(Experiment):
    rate: Host[float] = 0.5


def test_host_alias_is_annotated_and_still_validated():
    assert host_fields(WithHost) == {"max_epochs", "rate"}
    with pytest.raises(ConfigError, match="field 'rate' expects"):
        WithHost(rate="fast")


def test_changed_fields_names_every_changed_added_and_removed_field_host_ones_too():
    parent = {"lr": 0.01, "max_epochs": 2, "hidden": 8, "gone": "x"}
    child = {"lr": 0.05, "max_epochs": 3, "hidden": 8, "new": [1, 2]}
    assert changed_fields(parent, child) == {
        "lr": [0.01, 0.05], "max_epochs": [2, 3], "gone": ["x", None], "new": [None, [1, 2]],
    }  # fmt: skip
    assert changed_fields(parent, dict(parent)) == {}


class _WithNaN(Regression):
    """A config field that holds NaN (a sentinel some configs use for "unset")."""

    nan_value: list[float] = [float("nan"), float("nan")]
    clip: float = float("nan")


def test_an_unchanged_nan_field_is_not_in_parent_diff_nor_a_resume_refusal(tmp_path):
    """NaN compares equal to NaN as the config's JSON says: a branch that changed only
    max_epochs reports only max_epochs (it once reported ``nan_value: [NaN, NaN]`` changed),
    and a continued run with the same NaN fields is not refused."""
    run = tmp_path / "runs/nan"
    Nitro(_WithNaN(max_epochs=1, samples=64), run_dir=run).train().close()
    n = Nitro(_WithNaN(max_epochs=2, samples=64), run_dir=tmp_path / "runs/branch",
              resume=str(run / read_manifest(run)[-1].file))  # fmt: skip
    assert n.parent_diff == {"max_epochs": [1, 2]}
    n.close()
    again = Nitro(_WithNaN(max_epochs=2, samples=64), run_dir=run, resume="auto").train()
    assert again.epoch == 2
    again.close()
    assert config_diff({**config_of(_WithNaN()), "clip": 1.0}, _WithNaN()) == ["  clip: 1.0 -> nan"]
    assert changed_fields({"a": [1.0, float("nan")]}, {"a": [1.0, float("nan")]}) == {}
    assert changed_fields({"a": {"b": float("nan")}}, {"a": {"b": 0.5}}) != {}
