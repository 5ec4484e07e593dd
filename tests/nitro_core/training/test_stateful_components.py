"""An experiment's own stateful components (``Experiment.stateful``: a curriculum, a replay
buffer) are part of the exact resume: every record holds their states, a resume puts them
back, and a record that holds other components than the experiment declares is refused."""

from __future__ import annotations

import pytest
import torch
from pydantic import PrivateAttr

from nitro_core import Checkpointer, Last, Nitro
from nitro_core.errors import ConfigError, RecordError, ResumeRefused
from nitro_core.store.listing import read_manifest
from nitro_core.store.recordio import read_header, read_record
from tests.nitro_core.training.test_resume import _train_epochs, assert_same_state

from ..tiny import Tiny


class Curriculum:
    """A difficulty schedule that draws from a generator of its own: it moves every step,
    and the loss depends on it, so a resume that lost its state would train differently."""

    def __init__(self) -> None:
        self.steps = 0
        self.gen = torch.Generator().manual_seed(7)

    def weight(self) -> float:
        self.steps += 1
        return 1.0 + float(torch.rand((), generator=self.gen)) * (self.steps % 3)

    def state_dict(self) -> dict:
        return {"steps": self.steps, "rng": self.gen.get_state(), "name": "linear"}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]
        self.gen.set_state(state["rng"])


class WithCurriculum(Tiny):
    max_epochs: int = 4
    _curriculum: Curriculum = PrivateAttr(default_factory=Curriculum)

    def checkpointer(self):
        return Checkpointer(keep=Last(2), async_write=False)

    def stateful(self, data):
        return {"curriculum": self._curriculum}

    def loss(self, model, batch):
        scale = self._curriculum.weight() if model.training else 1.0
        return scale * super().loss(model, batch)


def test_a_resume_puts_the_components_back_and_continues_bit_for_bit(tmp_path):
    a = Nitro(WithCurriculum(), run_dir=tmp_path / "a").train()
    b = _train_epochs(Nitro(WithCurriculum(), run_dir=tmp_path / "b"), 2)
    assert b.components["curriculum"].steps == b.step
    c = Nitro(WithCurriculum(), run_dir=tmp_path / "b", resume="auto")
    restored = c.components["curriculum"]
    assert restored.steps == b.step  # loaded before train(), not replayed
    assert torch.equal(restored.gen.get_state(), b.components["curriculum"].gen.get_state())
    c.train()
    assert_same_state(a, c)
    assert c.components["curriculum"].steps == a.components["curriculum"].steps == a.step


def test_every_record_holds_the_components_state_in_its_own_section(tmp_path):
    n = Nitro(WithCurriculum(max_epochs=2), run_dir=tmp_path).train()
    entry = read_manifest(tmp_path)[-1]
    tensors, meta = read_record(tmp_path / entry.file, entry.expected)
    assert meta["stateful"]["curriculum"]["steps"] == n.step
    assert meta["stateful"]["curriculum"]["name"] == "linear"
    assert torch.equal(
        tensors["stateful/curriculum/rng"], n.components["curriculum"].gen.get_state()
    )


def test_an_experiment_without_components_writes_no_stateful_section(tmp_path):
    n = Nitro(Tiny(max_epochs=1), run_dir=tmp_path).train()
    assert n.components == {}
    entry = read_manifest(tmp_path)[-1]
    meta = read_header(tmp_path / entry.file, entry.expected)
    assert "stateful" not in meta


class Declares(Tiny):
    """Declares a component the record may not hold."""

    def stateful(self, data):
        return {"buffer": Curriculum()}


@pytest.mark.parametrize(
    ("trained", "resumed", "words"),
    [
        (
            Tiny,
            Declares,
            "holds the states of the components [], and Declares.stateful() declares ['buffer']",
        ),
        (
            Declares,
            Tiny,
            "holds the states of the components ['buffer'], and Tiny.stateful() declares []",
        ),
    ],
)
def test_a_record_with_other_components_is_refused_as_a_resume(tmp_path, trained, resumed, words):
    Nitro(trained(max_epochs=1), run_dir=tmp_path).train()
    with pytest.raises(ResumeRefused) as refused:
        Nitro(resumed(max_epochs=2), run_dir=tmp_path, resume="auto")
    assert words in str(refused.value)
    assert "start a new run from its weights: weights=" in str(refused.value)
    Nitro(
        resumed(max_epochs=2),
        run_dir=tmp_path / "new",
        weights=tmp_path / read_manifest(tmp_path)[-1].file,
    )


class ReturnsList(Tiny):
    def stateful(self, data):
        return [Curriculum()]


class BadName(Tiny):
    def stateful(self, data):
        return {"a/b": Curriculum()}


class NoLoad(Tiny):
    def stateful(self, data):
        return {"counter": object()}


@pytest.mark.parametrize(
    ("cls", "words"),
    [
        (ReturnsList, "ReturnsList.stateful() returned list; return a dict of names to objects"),
        (BadName, "names a component 'a/b'; a name is a word of letters"),
        (
            NoLoad,
            "NoLoad.stateful()['counter'] is a object, which has no state_dict and no "
            "load_state_dict(); give it state_dict() and load_state_dict(state)",
        ),
    ],
)
def test_a_component_that_cannot_be_recorded_is_refused_at_construction(tmp_path, cls, words):
    with pytest.raises(ConfigError) as refused:
        Nitro(cls(max_epochs=1), run_dir=tmp_path)
    assert words in str(refused.value)
    assert not (tmp_path / "manifest.json").exists()


class Unpicklable(Tiny):
    def stateful(self, data):
        class Holder:
            def state_dict(self):
                return {"fn": print}

            def load_state_dict(self, state):
                pass

        return {"holder": Holder()}

    def checkpointer(self):
        return Checkpointer(keep=Last(1), async_write=False)


def test_a_component_state_a_record_cannot_hold_without_pickle_is_refused(tmp_path):
    with pytest.raises(RecordError, match="cannot store without pickle"):
        Nitro(Unpicklable(max_epochs=1), run_dir=tmp_path).train()
    assert read_manifest(tmp_path) == []  # nothing listed
