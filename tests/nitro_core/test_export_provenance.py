"""An export's provenance names what was exported: the record whose weights the file holds
and the run, epoch and step they were trained to, never only the file the handle started
from (``weights=``/``resume=``) beside the step of a later state."""

from __future__ import annotations

import pytest

from nitro_core import Nitro, checkpoint_info, export_weights, read_manifest
from nitro_core.examples import Regression

from .tiny import Scripted

EXP = Regression(max_epochs=3, samples=64)


def _record(run, epoch):
    (entry,) = [e for e in read_manifest(run) if e.epoch == epoch]
    return entry


@pytest.fixture
def one_epoch(tmp_path):
    run = tmp_path / "runs/a"
    Nitro(Regression(max_epochs=1, samples=64), run_dir=run).train().close()
    return run


def test_a_handle_trained_past_what_it_resumed_names_its_own_last_record(one_epoch, tmp_path):
    n = Nitro(EXP, run_dir=one_epoch, resume="auto").train()
    info = checkpoint_info(export_weights(n, tmp_path / "w.safetensors"))
    assert info["source_file"] == str(one_epoch / _record(one_epoch, 3).file)
    assert (info["run"], info["epoch"], info["step"]) == (n.run_id, 3, n.step)
    n.close()


def test_a_handle_that_started_from_weights_names_its_trained_record(one_epoch, tmp_path):
    source = str(one_epoch / _record(one_epoch, 1).file)
    run = tmp_path / "runs/b"
    n = Nitro(Regression(max_epochs=2, samples=64), run_dir=run, weights=source).train()
    info = checkpoint_info(export_weights(n, tmp_path / "w.safetensors"))
    assert info["source_file"] == str(run / _record(run, 2).file) != source
    assert (info["run"], info["epoch"]) == (n.run_id, 2)
    n.close()


def test_an_untrained_handle_names_what_it_loaded(one_epoch, tmp_path):
    n = Nitro(EXP, run_dir=one_epoch, resume="auto")
    info = checkpoint_info(export_weights(n, tmp_path / "w.safetensors"))
    assert info["source_file"] == str(one_epoch / _record(one_epoch, 1).file)
    assert (info["epoch"], info["step"]) == (1, n.step)
    n.close()


def test_restore_best_names_the_best_record_and_its_epoch(tmp_path):
    run = tmp_path / "runs/c"
    n = Nitro(Scripted(max_epochs=3, scores=(5.0, 1.0, 4.0)), run_dir=run, restore_best=True)
    n.train()
    best = _record(run, 2)  # score 1.0: not the last epoch's
    info = checkpoint_info(export_weights(n, tmp_path / "w.safetensors"))
    assert info["source_file"] == str(run / best.file)
    assert (info["epoch"], info["step"]) == (2, best.step) != (n.epoch, n.step)
    n.close()
