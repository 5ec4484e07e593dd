"""What a question about an experiment's code is answered (nitro_core.jobs.probe), asked here
in-process (the server asks it of a forked child: tests/nitro_mcp/test_boundaries.py)."""

from __future__ import annotations

from nitro_core.examples import Regression
from nitro_core.experiment import config_of
from nitro_core.jobs.probe import Question, answer

MODULE = """
from nitro_core.examples import Regression


class NeedsWidth(Regression):
    width: int  # no default: the class cannot be built from its defaults

    def build_model(self):
        raise SystemExit("a hook that exits is no answer")


class Tight(Regression):
    def checkpointer(self):
        from nitro_core import Checkpointer, Last
        return Checkpointer(keep=Last(1))
"""


def test_shapes_splits_logger_and_monitor_are_answered_as_data():
    said = answer(Question(experiment="Regression", config=config_of(Regression(hidden=8)),
                           asks=["shapes", "splits", "logger", "monitor"]))  # fmt: skip
    assert said["shapes"]["0.weight"] == [8, Regression().features]
    assert said["splits"] == ["train", "val"] and said["logger"] == "jsonl"
    assert isinstance(said["monitor"], list)


def test_what_the_code_cannot_answer_is_none_and_the_others_are_still_described(tmp_path):
    (tmp_path / "probed.py").write_text(MODULE)
    module = str(tmp_path / "probed.py")
    said = answer(Question(modules=[module], experiment="NeedsWidth", asks=["splits"],
                           described=["NeedsWidth", "Regression"]))  # fmt: skip
    assert said["splits"] is None  # NeedsWidth() does not build from its defaults
    assert said["described"]["NeedsWidth"] == {"splits": None, "monitor": None}
    assert said["described"]["Regression"]["splits"] == ["train", "val"]
    built = answer(Question(modules=[module], experiment="NeedsWidth",
                            config={**config_of(Regression()), "width": 3}, asks=["shapes"]))  # fmt: skip
    assert built == {"shapes": None}  # build_model raised SystemExit: no answer, no exit


def test_a_keep_that_cannot_hold_an_average_is_answered_with_the_refusal(tmp_path):
    (tmp_path / "probed.py").write_text(MODULE)
    said = answer(Question(modules=[str(tmp_path / "probed.py")], experiment="Tight",
                           keep_for="Average(Last(3))"))  # fmt: skip
    assert said["keep"] is not None
    assert "restore_best=Average(Last(3)) needs records that keep=(Last(1))" in said["keep"][0]
    held = answer(Question(experiment="Regression", keep_for="Average(Last(1))"))
    assert held["keep"] is None
