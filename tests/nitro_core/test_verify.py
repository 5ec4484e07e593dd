"""``verify`` (``nitro verify PATH|RUN_DIR``, the ``nitro_verify`` tool) checks every byte of
every record it is given: listed ones against the manifest, unlisted ones against their own
header, a missing or resized file by name."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nitro_core import CheckpointMissing, Nitro, average_checkpoints, read_manifest, verify
from nitro_mcp.cli import main

from . import by_hand
from .tiny import KeepLast


@pytest.fixture
def run(tmp_path) -> Path:
    d = tmp_path / "run"
    Nitro(KeepLast(), run_dir=d).train().logger.close()
    return d


def flip_params(path: Path) -> None:
    begin, end = by_hand.section_range(path, "params")
    raw = bytearray(path.read_bytes())
    raw[begin] ^= 0x01
    path.write_bytes(bytes(raw))


def test_a_run_directory_verifies_every_listed_record_and_every_unlisted_one(run):
    average_checkpoints(run, "latest => Average(Last(2))", save=run / "avg.safetensors")
    checks = verify(run)
    files = [e.file for e in read_manifest(run)]
    assert [(c.file, c.listed, c.ok) for c in checks] == [
        *((f, True, True) for f in files),
        ("avg.safetensors", False, True),
    ]
    assert checks[0].sections == ["optim", "params", "rng"]
    assert checks[0].bytes == (run / files[0]).stat().st_size


def test_each_kind_of_damage_is_named_file_by_file(run):
    first, second = read_manifest(run)
    flip_params(run / first.file)
    (run / second.file).unlink()
    stray = run / "stray.safetensors"
    shutil.copyfile(run / first.file, stray)
    with open(stray, "ab") as f:
        f.write(b"\0")
    checks = {c.file: c for c in verify(run)}
    actual = by_hand.sections(run / first.file)["params"]
    assert checks[first.file].problem is not None
    assert checks[first.file].problem.startswith(
        f"Checkpoint {str(run / first.file)!r} is corrupt: its 'params' section digests to "
        f"xxh3-128:{actual[:16]}..."
    )
    assert (
        checks[second.file].problem == f"{second.file!r} is listed by the manifest but not on disk."
    )
    assert checks["stray.safetensors"].problem == (
        f"Checkpoint {str(stray)!r} has bytes past the end its header describes."
    )
    with open(run / first.file, "ab") as f:
        f.write(b"\0")
    assert {c.file: c for c in verify(run)}[first.file].problem == (
        f"{first.file!r} holds {first.bytes + 1} bytes; the manifest recorded {first.bytes} when "
        "it was written (truncated, or bytes appended)."
    )


def test_a_single_file_is_checked_against_its_manifest_entry_when_listed(run):
    entry = read_manifest(run)[-1]
    (check,) = verify(run / entry.file)
    assert (check.file, check.listed, check.ok) == (str(run / entry.file), True, True)
    with pytest.raises(CheckpointMissing) as exc:
        verify(run / "nothing.safetensors")
    assert str(exc.value) == (
        f"Nothing to verify at {str(run / 'nothing.safetensors')!r}: it is neither a record nor "
        "a run directory. Give a .safetensors record or a run directory, e.g. nitro verify "
        "runs/Classifier."
    )


def test_nitro_verify_prints_a_line_per_file_and_exits_1_on_damage(run, capsys):
    assert main(["verify", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "2 record file(s) checked, 0 corrupt"
    assert out[0].startswith("ok       epoch-") and out[0].endswith(": optim, params, rng")
    flip_params(run / read_manifest(run)[0].file)
    assert main(["verify", str(run)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("CORRUPT  epoch-") and out[-1] == "2 record file(s) checked, 1 corrupt"


def test_nitro_verify_help_has_a_summary_and_an_example():
    out = subprocess.run(
        [sys.executable, "-m", "nitro_mcp.cli", "verify", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "check every byte of a record, or of a run directory's records" in out
    assert "example:\n  nitro verify runs/Classifier" in out
