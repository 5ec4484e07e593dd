"""A resume's setup does only what it needs: the model it is about to overwrite from its
record is built on the meta device and given empty storage (no random initialization), and
the resumed run is still the uninterrupted one, bit for bit. Where the record does not hold
everything the model is (a non-persistent buffer, a tensor kept as a plain attribute, the
initial weights of a ``w0`` decay anchor), the model is built as usual."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
import torch

from nitro_core import Nitro
from nitro_core.examples import Regression


class Tracked(Regression):
    """Regression noting, at each build, whether its weights were made on the meta device."""

    built: ClassVar[list[bool]] = []

    def build_model(self) -> torch.nn.Module:
        model = super().build_model()
        Tracked.built.append(next(model.parameters()).is_meta)
        return model


class WithScale(Tracked):
    """A random constant the forward pass uses, drawn from NumPy's generator as the model is
    built and kept in a non-persistent buffer (no record has it): a resume must draw it again,
    the same."""

    def build_model(self) -> torch.nn.Module:
        inner = super().build_model()
        model = torch.nn.Sequential(inner)
        drawn = 1.0 + float(np.random.rand())
        model.register_buffer("scale", torch.full((1,), drawn), persistent=False)
        return model

    def loss(self, model, batch):
        return torch.nn.functional.mse_loss(model(batch["x"]) * model.scale, batch["y"])


class WithAttribute(Tracked):
    """A constant kept in a list attribute of the module (no record has it)."""

    def build_model(self) -> torch.nn.Module:
        model = torch.nn.Sequential(super().build_model())
        model.constants = [torch.full((1,), 3.0)]  # type: ignore[assignment]
        return model

    def loss(self, model, batch):
        return torch.nn.functional.mse_loss(model(batch["x"]) * model.constants[0], batch["y"])


class Tied(Tracked):
    """Two layers sharing one weight (tied weights: a record holds it once)."""

    def build_model(self) -> torch.nn.Module:
        model = torch.nn.Sequential(super().build_model(), torch.nn.Linear(1, 1))
        model[1].weight = (
            model[0][2].weight if model[0][2].weight.shape == (1, 1) else model[1].weight
        )
        first = torch.nn.Linear(1, 1)
        model.append(first)
        first.weight = model[1].weight
        return model


class AnchoredAtInit(Tracked):
    def decay_anchor(self):
        return "w0"


def _weights(n: Nitro) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in n.model.state_dict().items()}


@pytest.mark.parametrize(
    ("cls", "builds_on_resume"),
    [
        (Tracked, [True]),  # meta only: no initialization paid
        (WithScale, [True, False]),  # the buffer is not in the record: built as usual
        (WithAttribute, [True, False]),
        (Tied, [True, False]),  # to_empty would untie them
        (AnchoredAtInit, [False]),  # w0 is the initial weights: they must be made
    ],
)
def test_a_resume_skips_only_the_initialization_its_record_replaces(
    tmp_path, cls, builds_on_resume
):
    fields = {"max_epochs": 3, "samples": 64, "batch_size": 16}
    whole = Nitro(cls(**fields), run_dir=tmp_path / "a")
    whole.train()
    Nitro(cls(**{**fields, "max_epochs": 2}), run_dir=tmp_path / "b").train()
    Tracked.built.clear()
    resumed = Nitro(cls(**fields), run_dir=tmp_path / "b", resume="auto")
    assert Tracked.built == builds_on_resume
    assert not any(p.is_meta for p in resumed.model.parameters())
    resumed.train()
    assert resumed.epoch == 3
    theirs, ours = _weights(whole), _weights(resumed)
    assert theirs.keys() == ours.keys()
    for k in theirs:  # the uninterrupted run, bit for bit (A == B + C)
        assert torch.equal(theirs[k], ours[k]), k
    if cls is WithScale:  # the same draw: the meta build moved no generator
        assert torch.equal(resumed.model.scale, whole.model.scale)
    if cls is Tied:
        assert resumed.model[1].weight is resumed.model[2].weight
