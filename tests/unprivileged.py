"""Running a test's code where file permission bits bind, also when the tests run as root
(root ignores them: CAP_DAC_OVERRIDE). As root the code runs in a child process whose
capability bounding set lacks CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (``setpriv``, from
util-linux), so it stays root, owns what the test made, and is refused what a mode forbids;
otherwise in a plain child. A child that could write where a mode forbids it skips the test
rather than pass it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
_PROBE = """
import json, os, sys
from pathlib import Path
try:
    (Path(sys.argv[1]) / ".probe").touch()
except PermissionError:
    pass
else:
    print(json.dumps({"bits": "ignored"}))
    sys.exit(0)
"""
_DROPPED = "-dac_override,-dac_read_search"


def run(code: str, read_only: Path, *args: str, timeout: float = 240) -> dict[str, Any]:
    """Run ``code`` (Python, in the repository, ``sys.argv[1:]`` = ``read_only`` and
    ``args``) where permission bits bind; returns the JSON object it printed last. Skips the
    test where ``read_only`` (a directory of mode 0o555) can be written all the same."""
    command = [sys.executable, "-c", _PROBE + code, str(read_only), *args]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: permission bits cannot bind here")
        command = [setpriv, f"--inh-caps={_DROPPED}", f"--bounding-set={_DROPPED}", *command]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, (done.returncode, done.stdout, done.stderr[-4000:])
    out: dict[str, Any] = json.loads(lines[-1])
    if out.get("bits") == "ignored":
        pytest.skip("this process writes where mode 0o555 forbids it (a capability kept)")
    return out
