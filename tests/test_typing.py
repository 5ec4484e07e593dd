"""Nitro's public types work in a user's type checker: a ``Host[int]`` field is an ``int``.

Each case runs mypy (with the project's ``[tool.mypy]`` settings) the way a user would, on
``tests/typing/user_experiment.py`` and on a file that misuses a field, which mypy must reject.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parent.parent

WRONG = """\
from nitro_core import Experiment, Host


class MyExp(Experiment):
    max_epochs: Host[int] = 5


x: str = MyExp().max_epochs
"""


def _mypy(target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-color-output", str(target)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # mypy in a subprocess: the slow suite (the default stays under 4 minutes)
def test_a_users_experiment_type_checks():
    done = _mypy(ROOT / "tests" / "typing" / "user_experiment.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_mypy_rejects_a_host_int_read_as_a_str(tmp_path):
    wrong = tmp_path / "wrong_experiment.py"
    wrong.write_text(WRONG)
    done = _mypy(wrong)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        'wrong_experiment.py:8: error: Incompatible types in assignment (expression has type "int", '
        'variable has type "str")  [assignment]'
    ) in done.stdout
