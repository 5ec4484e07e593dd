"""A run directory Nitro cannot write in is refused with ``NotWritable`` (a ``NitroError`` and
a ``PermissionError``) naming the directory and what to do, when ``train()`` takes the run
and before a step: a new run directory in a read-only parent, one that is read-only itself,
and one an earlier run left its lock files in (they still open; its records would not); a
lock file created where it cannot be likewise.
Run where permission bits bind (tests/unprivileged.py: as root, without CAP_DAC_OVERRIDE)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from nitro_core import Nitro, NotWritable, read_manifest
from nitro_core.store.safeio import not_writable
from tests import unprivileged
from tests.nitro_core.tiny import Tiny

CHILD = """
from nitro_core import Nitro, read_manifest
from tests.nitro_core.tiny import Tiny
read_only, trained = Path(sys.argv[1]), Path(sys.argv[2])
out = {}
for name, run_dir, resume in (("new", read_only, False), ("below", read_only / "sub" / "run", False),
                              ("resumed", trained, "auto")):
    try:
        Nitro(Tiny(max_epochs=2), run_dir=run_dir, resume=resume).train()
        out[name] = "trained"
    except PermissionError as exc:
        out[name] = [type(exc).__name__, str(exc)]
out["listed"] = [e.file for e in read_manifest(trained)]
from nitro_core.store.claims import manifest_lock
try:
    with manifest_lock(read_only):  # a commit's lock file, created where it cannot be
        out["lock"] = "held"
except PermissionError as exc:
    out["lock"] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


def _fix(directory: Path) -> str:
    return f"Make it writable (chmod u+w {directory}), or choose another run_dir."


def test_a_run_directory_nitro_cannot_write_in_is_refused_before_a_step(tmp_path):
    read_only, trained = tmp_path / "read-only", tmp_path / "trained"
    Nitro(Tiny(max_epochs=1), run_dir=trained).train().close()
    listed = [e.file for e in read_manifest(trained)]
    read_only.mkdir()
    for directory in (read_only, trained):
        directory.chmod(0o555)
    try:
        out = unprivileged.run(CHILD, read_only, str(trained))
    finally:
        for directory in (read_only, trained):
            directory.chmod(0o755)
    assert out["new"] == [
        "NotWritable",
        f"Cannot write in '{read_only}': permission denied (Nitro keeps the files of a run "
        f"directory there). {_fix(read_only)}",
    ], out
    assert out["below"] == [
        "NotWritable",
        f"Cannot write in '{read_only}': permission denied (Nitro creates 'sub' there). "
        + _fix(read_only),
    ], out
    assert out["resumed"] == [
        "NotWritable",
        f"Cannot write in '{trained}': permission denied (Nitro keeps the files of a run "
        f"directory there). {_fix(trained)}",
    ], out
    assert out["lock"] == [
        "NotWritable",
        f"Cannot write in '{read_only}': permission denied (Nitro creates '.manifest.lock' "
        f"there). {_fix(read_only)}",
    ], out
    assert out["listed"] == listed  # refused before a step: nothing was written
    assert sorted(p.name for p in read_only.iterdir()) == []


@pytest.mark.parametrize(
    ("code", "where", "text"),
    [
        (errno.EACCES, "a run directory",
         "Cannot write in '/data/my runs': permission denied (Nitro creates 'r' there). Make it "
         "writable (chmod u+w '/data/my runs'), or choose another run_dir."),
        (errno.EROFS, "a run directory",
         "Cannot write in '/data/my runs': it is on a read-only file system (Nitro creates 'r' "
         "there). Mount it read-write, or choose another run_dir."),
        (errno.EPERM, "its job store",
         "Cannot write in '/data/my runs': permission denied (Nitro creates 'r' there). Make it "
         "writable (chmod u+w '/data/my runs'), or choose another directory."),
    ],
)  # fmt: skip
def test_the_refusal_names_the_directory_and_what_to_do(code, where, text):
    refused = not_writable(Path("/data/my runs"), "r", code, where)
    assert isinstance(refused, NotWritable) and isinstance(refused, PermissionError)
    assert str(refused) == text
