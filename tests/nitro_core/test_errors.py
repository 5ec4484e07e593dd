"""A ``NitroError`` keeps its parts as data: ``str(exc)`` is their Python text, and the
parts survive the JSON of a job's status file unchanged."""

from __future__ import annotations

import pytest

from nitro_core.errors import (
    WEIGHTS_ONLY,
    Call,
    CheckpointerFix,
    ConfigError,
    DiskFull,
    FieldFix,
    NitroError,
    Worded,
    arg,
    parts_from_json,
    parts_to_json,
)
from nitro_core.examples import Regression
from nitro_core.jobs.files import JobStatus, read_status, write_json

EVERY_PART = (
    arg("restore_optimizer", True), " needs weights=...; write ",
    WEIGHTS_ONLY, " or ", CheckpointerFix("keep=Last(1)"), ", or ",
    Call("train", {"experiment": "Regression", "resume": "auto", "overrides": {"max_epochs": 2}}),
    ". ", FieldFix("Regression", ("hidden", "lr"), "hidden", "int"),
    " ", Worded("write True.", "send true."),
)  # fmt: skip
EVERY_PART_PYTHON = (
    "restore_optimizer=True needs weights=...; write Nitro(exp, weights=...) or "
    "Checkpointer(keep=Last(1)), or TrainCall(experiment='Regression', resume='auto', "
    "overrides={'max_epochs': 2}). Write Regression(field=value) with values that fit. "
    "write True."
)


def test_an_error_is_its_parts_written_as_python():
    exc = ConfigError(*EVERY_PART)
    assert exc.parts == EVERY_PART
    assert str(exc) == EVERY_PART_PYTHON


def test_a_plain_message_is_one_part_and_reads_as_written():
    exc = NitroError("Nothing to do.")
    assert (exc.parts, str(exc)) == (("Nothing to do.",), "Nothing to do.")
    full = DiskFull("No room for 'm.safetensors'.")
    assert (str(full), full.errno, full.parts) == (
        "No room for 'm.safetensors'.", 28, ("No room for 'm.safetensors'.",)
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "python"),
    [(True, "strict=True"), (False, "strict=False"), (None, "strict=None"),
     ("auto", "strict='auto'"), ({"a": [1]}, "strict={'a': [1]}")],
)  # fmt: skip
def test_a_keyword_value_is_written_as_python_writes_it(value, python):
    assert str(ConfigError(arg("strict", value))) == python


def test_the_parts_survive_the_json_of_a_job_status_file(tmp_path):
    exc = ConfigError(*EVERY_PART)
    status = JobStatus(
        job_id="j", kind="train", state="failed", run_dir=str(tmp_path), created="now",
        error=str(exc), refusal=parts_to_json(exc.parts), failure="refused",
    )  # fmt: skip
    write_json(tmp_path / "status.json", status)
    back = read_status(tmp_path)
    assert parts_from_json(back.refusal) == EVERY_PART
    assert (back.error, back.failure) == (EVERY_PART_PYTHON, "refused")


def test_a_status_file_written_before_the_parts_still_reads(tmp_path):
    (tmp_path / "status.json").write_text(
        '{"job_id": "j", "kind": "train", "state": "failed", "run_dir": "r", "created": "now", '
        '"error": "Old text.", "hint": "Call again."}'
    )
    old = read_status(tmp_path)
    assert (old.error, old.refusal, old.failure, old.hint) == (
        "Old text.",
        None,
        None,
        "Call again.",
    )


def test_a_bad_config_names_the_field_to_fix_as_data():
    with pytest.raises(ConfigError) as exc:
        Regression(hidden="wide")
    assert str(exc.value) == (
        "Regression: field 'hidden' expects int, got 'wide' (str): Input should be a valid "
        "integer. Write Regression(field=value) with values that fit."
    )
    assert exc.value.parts[-1] == FieldFix(
        "Regression", tuple(Regression.model_fields), "hidden", "int", None
    )
