"""experiment_from_record: the experiment a record was written with, the caller's overrides on
top, each difference from the record named in a NitroWarning."""

from __future__ import annotations

import warnings

import pytest

from nitro_core import (
    ConfigError,
    Nitro,
    NitroWarning,
    experiment_from_record,
    export_weights,
    read_manifest,
)

from ..tiny import Tiny


def _warned(fn, *args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, [str(w.message) for w in caught if issubclass(w.category, NitroWarning)]


@pytest.fixture(scope="module")
def wide_run(tmp_path_factory):
    """A Tiny run trained away from its defaults (width 6, lr 0.02), three epochs."""
    run_dir = tmp_path_factory.mktemp("from_record") / "runs/wide"
    Nitro(Tiny(width=6, lr=0.02), run_dir=run_dir).train()
    return run_dir


def test_the_record_config_is_the_default(wide_run):
    exp, notes = _warned(experiment_from_record, Tiny, "latest => best", run_dir=wide_run)
    assert exp == Tiny(width=6, lr=0.02) and notes == []


def test_each_override_that_differs_from_the_record_is_named(wide_run):
    exp, notes = _warned(
        experiment_from_record, Tiny, "latest => latest", run_dir=wide_run, lr=0.1, width=6
    )
    assert exp == Tiny(width=6, lr=0.1)
    assert notes == ["overrides change lr: 0.02 (record) -> 0.1 (call)"]


def test_a_model_trained_away_from_the_defaults_loads_only_from_its_record(wide_run):
    with pytest.warns(NitroWarning), pytest.raises(ConfigError, match="does not fit Tiny's model"):
        Nitro(Tiny(), run_dir=wide_run, weights="latest => best")
    exp = experiment_from_record(Tiny, "latest => best", run_dir=wide_run)
    best = min(e.score for e in read_manifest(wide_run))
    assert Nitro(exp, run_dir=wide_run, weights="latest => best").validate()["loss"] == best


def test_a_path_needs_no_run_dir_and_a_pair_does(wide_run):
    path = wide_run / read_manifest(wide_run)[-1].file
    assert experiment_from_record(Tiny, str(path)) == Tiny(width=6, lr=0.02)
    with pytest.raises(ConfigError) as err:
        experiment_from_record(Tiny, "latest => best")
    assert str(err.value) == (
        "experiment_from_record(cls, 'latest => best') needs run_dir= to find the run; write "
        "experiment_from_record(cls, 'latest => best', run_dir='runs/MyExp')."
    )


def test_an_average_and_an_export_carry_the_config_of_their_records(wide_run, tmp_path):
    averaged = experiment_from_record(Tiny, "latest => Average(Last(2))", run_dir=wide_run)
    exported = export_weights("latest => best", tmp_path / "w.safetensors", run_dir=wide_run)
    assert averaged == experiment_from_record(Tiny, exported) == Tiny(width=6, lr=0.02)


def test_a_field_removed_since_is_dropped_and_one_added_since_takes_its_default(tmp_path):
    class Versioned(Tiny):
        gone: int = 3

    Nitro(Versioned(gone=5, max_epochs=1), run_dir=tmp_path).train()

    class Versioned(Tiny):  # noqa: F811 - the class as a later version of the code defines it
        added: int = 7

    exp, notes = _warned(experiment_from_record, Versioned, "latest => latest", run_dir=tmp_path)
    assert exp == Versioned(max_epochs=1, added=7)
    assert notes == ["the record's gone=5 is not a field of Versioned any more; dropped"]
    exp, notes = _warned(
        experiment_from_record, Versioned, "latest => latest", run_dir=tmp_path, added=8
    )
    assert exp.added == 8 and notes == [
        "the record's gone=5 is not a field of Versioned any more; dropped",
        "overrides set added=8, a field the record does not hold (its default is 7)",
    ]


def test_an_unknown_override_is_refused_by_the_class(wide_run):
    with pytest.raises(ConfigError, match="unknown field 'widht'"):
        experiment_from_record(Tiny, "latest => best", run_dir=wide_run, widht=3)


def test_recorded_json_values_come_back_as_the_field_types(tmp_path):
    class Shaped(Tiny):  # a strict model takes no list for a tuple
        sizes: tuple[int, ...] = (4,)

    exp = Shaped(sizes=(2, 3), max_epochs=1)
    Nitro(exp, run_dir=tmp_path).train()
    assert experiment_from_record(Shaped, "latest => latest", run_dir=tmp_path) == exp
