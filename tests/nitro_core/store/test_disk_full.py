"""A full disk never leaves a committed-but-unlisted record or a ``manifest.json.tmp``
behind: room for the record and for rewriting the manifest is checked before the record is
renamed into place, a write that fills the disk anyway removes its temporary file, and the
error (:class:`DiskFull`, also an ``OSError`` with errno ENOSPC) names the directory, the
bytes needed and what was kept. Full disks are simulated: the free-space figure
(``safeio.free_bytes``) or an ``fsync`` that fails with ENOSPC."""

from __future__ import annotations

import errno
import os
import re
import warnings
from pathlib import Path

import pytest

from nitro_core import Nitro, average_checkpoints, read_manifest
from nitro_core.errors import DiskFull
from nitro_core.store import atomic, safeio
from nitro_core.store import recordio as store

from ..tiny import KeepLast

KEPT = (
    "Nothing was committed: every file that was there (the manifest and each record it lists) "
    "is as it was, and the partial file was removed. Free space on that disk and write again "
    "(a training run resumes with resume='auto')."
)


def train(run_dir: Path, epochs: int, resume: str | bool = "auto") -> Nitro:
    n = Nitro(KeepLast(max_epochs=epochs), run_dir=run_dir, resume=resume)
    try:
        return n.train()
    finally:
        n.logger.close()


@pytest.fixture
def one_epoch(tmp_path):
    run = tmp_path / "run"
    train(run, 1, resume=False)
    return run, run.joinpath("manifest.json").read_bytes()


def leftovers(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir() if p.name.endswith(".tmp"))


def assert_kept_and_resumable(run: Path, manifest: bytes) -> None:
    """The manifest is byte for byte what it was, no temporary file is left, and the next
    run continues from the last listed epoch instead of starting from scratch."""
    assert run.joinpath("manifest.json").read_bytes() == manifest
    assert leftovers(run) == []
    assert [e.epoch for e in read_manifest(run)] == [1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unlisted record of a failed commit is set aside
        n = train(run, 2)
    assert [e.epoch for e in read_manifest(run)] == [1, 2] and n.run_id == read_manifest(run)[0].run


def fail_fsync_of(monkeypatch, suffix: str) -> None:
    """``os.fsync`` fails with ENOSPC for files whose name ends with ``suffix``."""
    real = os.fsync

    def fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(suffix):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_no_room_for_the_record_and_the_manifest_refuses_before_writing(one_epoch, monkeypatch):
    run, manifest = one_epoch
    monkeypatch.setattr(safeio, "free_bytes", lambda directory: 4096)
    with pytest.raises(DiskFull) as exc:
        train(run, 2)
    room = len(manifest) + store.MANIFEST_ROOM
    match = re.fullmatch(
        rf"No room left in {re.escape(repr(str(run)))} to commit '(epoch-0002-step-8-loss=[^']+)"
        rf"': it needs (\d+) bytes \((\d+) for the record, {room} to rewrite manifest.json\), "
        rf"4096 are free\. {re.escape(KEPT)}",
        str(exc.value),
    )
    assert match, str(exc.value)
    assert int(match[2]) == int(match[3]) + room and exc.value.errno == errno.ENOSPC
    assert not (run / match[1]).exists()
    monkeypatch.undo()
    assert_kept_and_resumable(run, manifest)


def test_no_room_left_for_the_manifest_after_the_record_is_written(one_epoch, monkeypatch):
    run, manifest = one_epoch
    answers = iter([10**12, 100])  # enough before the write, not after it

    monkeypatch.setattr(safeio, "free_bytes", lambda directory: next(answers))
    with pytest.raises(DiskFull) as exc:
        train(run, 2)
    room = len(manifest) + store.MANIFEST_ROOM
    match = re.fullmatch(
        rf"No room left in {re.escape(repr(str(run)))} to commit '(epoch-0002-step-8-loss=[^']+)"
        rf"': it needs {room} bytes to rewrite manifest.json after it is written, 100 are "
        rf"free\. {re.escape(KEPT)}",
        str(exc.value),
    )
    assert match, str(exc.value)
    assert not (run / match[1]).exists()
    monkeypatch.undo()
    assert_kept_and_resumable(run, manifest)


def test_a_disk_that_fills_while_the_record_is_written_leaves_no_partial_file(
    one_epoch, monkeypatch
):
    run, manifest = one_epoch
    fail_fsync_of(monkeypatch, ".safetensors.tmp")
    with pytest.raises(DiskFull) as exc:
        train(run, 2)
    match = re.fullmatch(
        rf"No room left in {re.escape(repr(str(run)))} to commit '(epoch-0002-step-8-loss=[^']+)"
        rf"': it needs (\d+) bytes, (\d+) are free\. {re.escape(KEPT)}",
        str(exc.value),
    )
    assert match, str(exc.value)
    monkeypatch.undo()
    assert_kept_and_resumable(run, manifest)


def test_a_disk_that_fills_while_the_manifest_is_rewritten_keeps_the_old_one(
    one_epoch, monkeypatch
):
    run, manifest = one_epoch
    fail_fsync_of(monkeypatch, "manifest.json.tmp")
    with pytest.raises(DiskFull) as exc:
        train(run, 2)
    match = re.fullmatch(
        rf"No room left in {re.escape(repr(str(run)))} to rewrite manifest.json: it needs "
        r"(\d+) bytes, (\d+) are free\. Kept: manifest.json as it was before this update, with "
        r"every record it lists \(the temporary file was removed\); a record written for this "
        r"update is not listed and counts for nothing\. Free space on that disk and resume "
        r"with resume='auto'\.",
        str(exc.value),
    )
    assert match, str(exc.value)
    assert int(match[1]) > len(manifest)  # the new manifest, one entry longer
    monkeypatch.undo()
    assert_kept_and_resumable(run, manifest)


def test_a_saved_average_that_fills_the_disk_leaves_nothing(one_epoch, monkeypatch):
    run, _ = one_epoch
    save = run / "avg.safetensors"
    fail_fsync_of(monkeypatch, "avg.safetensors.tmp")
    with pytest.raises(DiskFull) as exc:
        average_checkpoints(run, "latest => Average(Last(1))", save=save)
    assert re.fullmatch(
        rf"No room left in {re.escape(repr(str(run)))} to commit 'avg.safetensors': it needs "
        rf"(\d+) bytes, (\d+) are free\. {re.escape(KEPT)}",
        str(exc.value),
    ), str(exc.value)
    assert not save.exists() and not store.tmp_path(save).exists()


def test_a_commit_that_fills_the_disk_keeps_the_old_file_and_removes_the_tmp(tmp_path, monkeypatch):
    path = tmp_path / "status.json"
    path.write_bytes(b"old")
    fail_fsync_of(monkeypatch, "status.json.tmp")
    with pytest.raises(DiskFull) as exc:
        atomic.Replace(path).commit(lambda f: f.write(b"new"))
    assert re.fullmatch(
        rf"No room left in {re.escape(repr(str(tmp_path)))} to write 'status.json' \(\d+ bytes "
        r"free\): 'status.json' was kept as it was, and the temporary file removed\. Free space "
        r"on that disk and try again\.",
        str(exc.value),
    ), str(exc.value)
    assert path.read_bytes() == b"old" and not store.tmp_path(path).exists()
    assert isinstance(exc.value, OSError) and exc.value.errno == errno.ENOSPC
