"""Refusals at mid-epoch points name the point (epoch, batch, step), never the epoch alone:
several points share an epoch, so "epoch 3" would name none of them."""

from __future__ import annotations

import pytest
from pydantic import PrivateAttr

from nitro_core import Checkpointer, CheckpointNotFound, Last, Nitro, average_checkpoints
from nitro_core.errors import MonitorError
from nitro_core.store.manifest import read_manifest

from ..steps import Steps


class KeepLastTwo(Steps):
    def checkpointer(self):
        return Checkpointer(keep=Last(2), every_steps=self.every)


class NanAtSecondPoint(Steps):
    """Steps (a point every 3 steps, 8 batches an epoch) whose 'score' is NaN at its second
    point: epoch 1 batch 6, step 6."""

    _calls: list[int] = PrivateAttr(default_factory=list)

    def metrics(self, model, batch):
        return {"n": (1, 1)}

    def finalize_metrics(self, totals, split):
        self._calls.append(1)
        return {"score": float("nan") if len(self._calls) == 2 else 1.0}

    def monitor(self):
        return ("score", "min")


def test_a_nan_score_at_a_mid_epoch_point_names_its_batch_and_step(tmp_path):
    n = Nitro(NanAtSecondPoint(), run_dir=tmp_path)
    with pytest.raises(MonitorError) as exc:
        n.train()
    n.logger.close()
    assert str(exc.value) == (
        "Monitored metric 'score' is nan on split 'val' at epoch 1 batch 6 (step 6); a "
        "non-finite score cannot be ranked, so the point at epoch 1 batch 6 (step 6) was not "
        "written and the records already on disk are untouched. Lower the learning rate or "
        "check the data, then continue from the last good record with resume='auto'."
    )
    assert [(e.epoch, e.batch, e.step) for e in read_manifest(tmp_path)] == [(1, 3, 3)]


def test_averaging_refusals_under_mid_epoch_points_name_the_points(tmp_path):
    n = Nitro(KeepLastTwo(), run_dir=tmp_path).train()
    assert [(e.epoch, e.batch, e.step) for e in read_manifest(tmp_path)] == [
        (3, 5, 21),
        (3, None, 24),
    ]
    held = "points epoch 3 batch 5 (step 21), epoch 3 end (step 24)"
    with pytest.raises(CheckpointNotFound) as exc:
        average_checkpoints(tmp_path, "latest => Average(Last(3))")
    assert str(exc.value) == (
        f"Cannot average 'latest => Average(Last(3))' in {str(tmp_path)!r}: Last(3) names points "
        f"epoch 3 batch 2 (step 18), epoch 3 batch 5 (step 21), epoch 3 end (step 24) of run "
        f"{n.run_id}, which kept {held} under keep=(Last(2)); it no longer holds epoch 3 batch "
        "2 (step 18). Keep them while training: Checkpointer(keep=(Last(2), Last(3)))."
    )
    with pytest.raises(CheckpointNotFound) as exc:
        average_checkpoints(tmp_path, "latest => Average(Last(20))")
    assert str(exc.value) == (
        f"Cannot average 'latest => Average(Last(20))' in {str(tmp_path)!r}: Last(20) needs 20 "
        f"points and the run passed 10 (run {n.run_id} holds {held}). Average fewer points, or "
        "train the run further."
    )


def test_an_epoch_end_gone_among_mid_epoch_points_is_named_by_its_place(tmp_path):
    # the named points are epoch ends: the gone one is 'epoch 2 end (step 16)', not a bare
    # '2' beside 'kept points epoch 3 batch 5 ...' (read as a count)
    n = Nitro(KeepLastTwo(), run_dir=tmp_path).train()
    held = "points epoch 3 batch 5 (step 21), epoch 3 end (step 24)"
    with pytest.raises(CheckpointNotFound) as exc:
        average_checkpoints(tmp_path, "latest => Average(Epochs(2:3))")
    assert str(exc.value) == (
        f"Cannot average 'latest => Average(Epochs(2:3))' in {str(tmp_path)!r}: Epochs(2:3) names "
        f"epochs 2, 3 of run {n.run_id}, which kept {held} under keep=(Last(2)); it no longer "
        "holds epoch 2 end (step 16). Keep them while training: "
        "Checkpointer(keep=(Last(2), Epochs(2:3)))."
    )
