"""A record directory (what an FSDP run writes) named by its path, as a string, is a source
wherever a record file is: ``weights=``, ``resume=``, ``export_weights``; a path that names
no record is refused naming both forms a source can take."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nitro_core import (
    Checkpointer,
    CheckpointNotFound,
    Last,
    Nitro,
    checkpoint_info,
    export_weights,
    read_manifest,
)
from nitro_core.examples import Classifier
from tests.nitro_core.record_dirs import to_record_directory


class Small(Classifier):
    samples: int = 64

    def checkpointer(self):
        return Checkpointer(keep=Last(2))


@pytest.fixture
def sharded(tmp_path):
    """A run in ``runs/x`` (relative to the working directory, tmp_path) whose latest
    record is a record directory."""
    n = Nitro(Small(max_epochs=2), run_dir="runs/x").train()
    directory = to_record_directory(Path("runs/x"))
    assert read_manifest("runs/x")[-1].file == directory.name and directory.is_dir()
    return n, directory


def test_a_record_directory_named_by_its_path_loads_as_weights_and_resumes(sharded):
    n, directory = sharded
    asser_name = directory.name  # epoch-0002-step-2-acc=...: '=', '.' and '-' in a path
    assert "=" in asser_name and "." in asser_name
    trained = {k: v.clone() for k, v in n.model.state_dict().items()}
    for form in (str(directory), f"{directory}/", directory.name, f"{directory.name}/"):
        w = Nitro(Small(), run_dir="runs/x", weights=form)
        assert w.checkpoint_source == directory, form
        for key, value in w.model.state_dict().items():
            assert torch.equal(value, trained[key]), (form, key)
        r = Nitro(Small(max_epochs=3), run_dir="runs/x", resume=form)
        assert (r.epoch, r.step, r.run_id) == (2, n.step, n.run_id), form
    r.train()  # continues the run from the record directory
    assert r.epoch == 3 and read_manifest("runs/x")[-1].epoch == 3


def test_export_weights_takes_a_record_directory_named_by_its_path(sharded, tmp_path):
    n, directory = sharded
    out = export_weights(str(directory), tmp_path / "w.safetensors")
    assert checkpoint_info(out)["source_file"] == str(directory)
    weights = load_file(str(out))
    for key, value in n.model.state_dict().items():
        assert torch.equal(weights[key], value), key


def test_a_path_that_names_no_record_is_refused_naming_both_forms(sharded):
    n, _ = sharded
    with pytest.raises(CheckpointNotFound) as exc:
        Nitro(Small(), run_dir="runs/x", weights="runs/x/epoch-0009-step-9-acc=0.5")
    assert str(exc.value) == (
        "Source 'runs/x/epoch-0009-step-9-acc=0.5' names no checkpoint: it is not a pair (a pair "
        "holds '=>', e.g. 'latest => best'), and no record is there (looked at "
        "'runs/x/epoch-0009-step-9-acc=0.5' and 'runs/x/runs/x/epoch-0009-step-9-acc=0.5': a "
        "record file ends in .safetensors, a record directory holds header.json); 'runs/x' "
        f"holds runs {n.run_id} (2 entries, epochs 1, 2). Write a pair such as 'latest => "
        "best', or the path of an existing record file or record directory."
    )


def test_a_run_directory_named_as_a_source_is_refused_naming_its_checkpoints(sharded):
    with pytest.raises(CheckpointNotFound) as exc:
        Nitro(Small(), run_dir="runs/x", weights="runs/x")
    assert str(exc.value) == (
        "Source 'runs/x' is the directory 'runs/x', not a record: it holds no header.json (a "
        "record directory several processes wrote holds header.json and its shards) and no "
        "manifest lists it. It is a run directory: name one of its checkpoints, e.g. "
        "'latest => best' with run_dir='runs/x'."
    )
