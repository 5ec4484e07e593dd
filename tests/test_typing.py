"""Nitro's public types work in a user's type checker: a ``Host[int]`` field is an ``int``.

mypy runs once (with the project's ``[tool.mypy]`` settings, in the repository, so on the
cache ``./dev``'s ``mypy nitro_core nitro_mcp`` leaves) the way a user would, on
``tests/typing/user_experiment.py`` and on a file that misuses a field together; each case
reads its file's lines of that one report: none for the user's experiment, the rejection for
the misuse, and nothing else.
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


def _mypy(*targets: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-color-output", *map(str, targets)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> subprocess.CompletedProcess[str]:
    """One mypy run over the user's experiment and the misuse (one process, one cache load)."""
    wrong = tmp_path_factory.mktemp("typing") / "wrong_experiment.py"
    wrong.write_text(WRONG)
    return _mypy(ROOT / "tests" / "typing" / "user_experiment.py", wrong)


@pytest.mark.slow  # mypy in a subprocess: the slow suite (the default stays under 4 minutes)
def test_a_users_experiment_type_checks(checked):
    out = checked.stdout + checked.stderr
    assert "user_experiment.py" not in out, out  # not one line about the user's file
    # the one error is the misuse's (below): nothing in nitro_core or the user's file
    assert "Found 1 error in 1 file (checked 2 source files)" in checked.stdout, out


@pytest.mark.slow  # a subprocess or a server: the slow suite (the default stays under 4 minutes)
def test_mypy_rejects_a_host_int_read_as_a_str(checked):
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert (
        'wrong_experiment.py:8: error: Incompatible types in assignment (expression has type "int", '
        'variable has type "str")  [assignment]'
    ) in checked.stdout
