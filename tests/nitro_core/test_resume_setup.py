"""A resume's setup does only what it needs: the model it is about to overwrite from its
record is built on the meta device and given empty storage (no random initialization), and
the resumed run is still the uninterrupted one, bit for bit. Where the record does not hold
everything the model is (a non-persistent buffer, a tensor kept as a plain attribute, the
initial weights of a ``w0`` decay anchor), the model is built as usual."""

from __future__ import annotations

from typing import ClassVar

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
    """A constant the forward pass uses, kept in a non-persistent buffer (no record has it)."""

    def build_model(self) -> torch.nn.Module:
        inner = super().build_model()
        model = torch.nn.Sequential(inner)
        model.register_buffer("scale", torch.full((1,), 3.0), persistent=False)
        return model

    def loss(self, model, batch):
        return torch.nn.functional.mse_loss(model(batch["x"]) * model.scale, batch["y"])


class WithAttribute(Tracked):
    """The same constant as a plain tensor attribute of the module."""

    def build_model(self) -> torch.nn.Module:
        model = torch.nn.Sequential(super().build_model())
        model.scale = torch.full((1,), 3.0)  # type: ignore[assignment]
        return model

    def loss(self, model, batch):
        return torch.nn.functional.mse_loss(model(batch["x"]) * model.scale, batch["y"])


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
    if cls in (WithScale, WithAttribute):
        assert torch.equal(resumed.model.scale, torch.full((1,), 3.0))
