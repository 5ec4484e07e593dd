"""restore_best=Average(...) that a run can never reach (max_epochs below what the selector
needs) is refused at construction, naming the keep, the selection and what to write."""

from __future__ import annotations

import pytest

from nitro_core import Best, Checkpointer, Last, Nitro
from nitro_core.errors import ConfigError
from nitro_core.examples import Regression
from nitro_core.sources.grammar import parse_source
from nitro_core.sources.selection import check_keep_holds

TAIL = "so the run would end keeping its final weights."
UNREACHABLE = [  # (selection, keep, max_epochs, every_steps, the refusal after "restore_best=...")
    ("Average(Best(5; among=Last(3)))", (Best(3), Last(5)), 10, None,
     "can never be restored under keep=(Best(3), Last(5)): Best(5; among=Last(3)) needs 5 scored points among "
     f"Last(3) and a run of max_epochs=10 passes at most 3 (one per epoch end), {TAIL} Write "
     "restore_best=Average(Best(3; among=Last(3)))."),
    ("Average(Every(5))", (Best(3), Last(5)), 3, None,
     "can never be restored under keep=(Best(3), Last(5)): Every(5) names every 5th epoch end and a run of "
     f"max_epochs=3 reaches none, {TAIL} Write restore_best=Average(Every(3)) or train for 5 epochs "
     "(max_epochs=5)."),
    ("Average(Epochs(2:7))", (Best(3), Last(10)), 5, 4,
     "can never be restored under keep=(Best(3), Last(10)): Epochs(2:7) names epochs past max_epochs=5 (6, 7), "
     f"{TAIL} Name epochs up to 5 in Epochs(...), or train for 7 epochs (max_epochs=7)."),
    ("Average(Best(4))", (Best(5), Last(1)), 3, None,
     "can never be restored under keep=(Best(5), Last(1)): Best(4) needs 4 scored points and a run of "
     f"max_epochs=3 passes at most 3 (one per epoch end), {TAIL} Write restore_best=Average(Best(3)) or train "
     "for 4 epochs (max_epochs=4)."),
]  # fmt: skip


@pytest.mark.parametrize(("text", "keep", "max_epochs", "every", "message"), UNREACHABLE)
def test_a_selection_past_what_the_run_reaches_is_refused(text, keep, max_epochs, every, message):
    avg = parse_source(f"latest => {text}").pick
    with pytest.raises(ConfigError) as exc:
        check_keep_holds(Checkpointer(keep=keep, every_steps=every), avg, max_epochs)
    assert str(exc.value) == f"restore_best={text} {message}"


def test_mid_epoch_points_reach_a_last_longer_than_the_epochs():
    avg = parse_source("latest => Average(Last(6))").pick
    check_keep_holds(Checkpointer(keep=(Last(6),), every_steps=2), avg, 2)  # 2 epochs, more points


class KeepFive(Regression):
    samples: int = 64

    def checkpointer(self):
        return Checkpointer(keep=(Best(3), Last(5)))


def test_nitro_refuses_at_construction_a_restore_best_that_max_epochs_never_reaches(tmp_path):
    with pytest.raises(ConfigError) as exc:
        Nitro(KeepFive(max_epochs=2), run_dir=tmp_path, restore_best="Average(Last(50))")
    assert str(exc.value) == (
        "restore_best=Average(Last(50)) can never be restored under keep=(Best(3), Last(5)): Last(50) needs 50 "
        f"points and a run of max_epochs=2 passes at most 2 (one per epoch end), {TAIL} Write "
        "restore_best=Average(Last(2)) or train for 50 epochs (max_epochs=50)."
    )
    assert not list(tmp_path.iterdir())
