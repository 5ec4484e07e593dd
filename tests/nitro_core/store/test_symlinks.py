"""Links planted in a run directory never let a write escape it, nor a read echo a file
outside it: every file Nitro keeps there is opened without following a link (O_NOFOLLOW),
and ``logs/`` must resolve inside the run directory (compared as paths, not as strings).
A listed record is read by name and never through a link; a path the caller names is
theirs, and followed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from nitro_core import Nitro, average_checkpoints, checkpoint_info, read_manifest
from nitro_core.errors import UnsafePath
from nitro_core.store import recordio as store

from ..tiny import KeepLast

VICTIM = b"outside the run directory\n"


def link_refusal(path: Path) -> str:
    return (
        f"Refusing to open {str(path)!r}: it is a symbolic link, and Nitro never follows a link "
        "for a file it keeps in a run directory (it could lead outside it). Replace the link by "
        "the real file, or remove it."
    )


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "outside" / "victim.txt"
    path.parent.mkdir()
    path.write_bytes(VICTIM)
    return path


def train(run_dir: Path, epochs: int = 1, **kwargs) -> Nitro:
    n = Nitro(KeepLast(max_epochs=epochs), run_dir=run_dir, **kwargs)
    try:
        return n.train()
    finally:
        n.logger.close()


def test_a_logs_link_to_a_sibling_directory_is_refused(tmp_path):
    run = tmp_path / "run"
    sibling = tmp_path / "run2" / "logs"  # shares the string prefix 'run': not inside
    sibling.mkdir(parents=True)
    run.mkdir()
    (run / "logs").symlink_to(sibling)
    with pytest.raises(UnsafePath) as exc:
        train(run)
    assert str(exc.value) == (
        f"Refusing to write into {str(run / 'logs')!r}: it is a link that leads outside the run "
        f"directory {str(run)!r}, and Nitro writes only inside it. Replace the link by a real "
        "directory, or remove it."
    )
    assert list(sibling.iterdir()) == []


def test_a_logs_link_that_stays_inside_the_run_directory_is_used(tmp_path):
    run = tmp_path / "run"
    (run / "real-logs").mkdir(parents=True)
    (run / "logs").symlink_to(run / "real-logs")
    n = train(run)
    assert (run / "real-logs" / f"{n.run_id}.jsonl").read_text().count("\n") == 1


def test_a_log_file_link_is_refused(tmp_path, victim):
    run = tmp_path / "run"
    n = train(run)
    log = run / "logs" / f"{n.run_id}.jsonl"
    log.unlink()
    log.symlink_to(victim)
    with pytest.raises(UnsafePath) as exc:
        train(run, epochs=2, resume="auto")
    assert str(exc.value) == link_refusal(log)
    assert victim.read_bytes() == VICTIM


@pytest.mark.parametrize("name", ["manifest.json.tmp", ".manifest.lock"])
def test_a_link_at_a_manifest_file_name_is_refused_and_the_target_untouched(tmp_path, victim, name):
    run = tmp_path / "run"
    run.mkdir()
    (run / name).symlink_to(victim)
    with pytest.raises(UnsafePath) as exc:
        train(run)
    assert str(exc.value) == link_refusal(run / name)
    assert victim.read_bytes() == VICTIM


def test_a_manifest_link_is_never_read_nor_echoed(tmp_path, victim):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").symlink_to(victim)
    for call in (
        lambda: read_manifest(run),
        lambda: Nitro(KeepLast(), run_dir=run, resume="auto"),
    ):
        with pytest.raises(UnsafePath) as exc:
            call()
        assert str(exc.value) == link_refusal(run / "manifest.json")


def test_a_saved_averages_tmp_link_is_refused_and_the_target_untouched(tmp_path, victim):
    run = tmp_path / "run"
    train(run, epochs=2)
    save = run / "avg.safetensors"
    (run / "avg.safetensors.tmp").symlink_to(victim)
    with pytest.raises(UnsafePath) as exc:
        average_checkpoints(run, "latest => Average(Last(2))", save=save)
    assert str(exc.value) == link_refusal(run / "avg.safetensors.tmp")
    assert victim.read_bytes() == VICTIM and not os.path.lexists(save)


def test_a_record_tmp_link_is_set_aside_and_never_written_through(tmp_path, victim):
    record = tmp_path / "epoch-0001-step-4.safetensors"
    store.tmp_path(record).symlink_to(victim)
    reservation = store.reserve(record)
    try:
        assert [p.name for p in reservation.set_aside] == [
            "epoch-0001-step-4.safetensors.tmp.stale"
        ]
        store.write_record(reservation, {"params/w": torch.ones(3)}, {"epoch": 1})
    finally:
        reservation.release()
    assert victim.read_bytes() == VICTIM
    assert not record.is_symlink() and store.read_record(record)[0]["params/w"].sum() == 3


def test_a_run_lock_link_is_refused_and_creates_nothing_outside(tmp_path):
    outside = tmp_path / "outside.lock"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".run-abc.lock").symlink_to(outside)  # dangling: O_CREAT would create it
    with pytest.raises(UnsafePath) as exc, store.run_lock(tmp_path / "run", "abc"):
        pass
    assert str(exc.value) == link_refusal(tmp_path / "run" / ".run-abc.lock")
    assert not outside.exists()


def test_a_listed_record_swapped_for_a_link_is_refused_unread(tmp_path):
    run = tmp_path / "run"
    train(run, epochs=2)
    first, last = read_manifest(run)
    record = run / last.file
    outside = tmp_path / "outside" / last.file
    outside.parent.mkdir()
    shutil.copyfile(record, outside)  # a faithful copy: every digest check would pass
    record.unlink()
    record.symlink_to(outside)
    calls = {
        "read_record": lambda: store.read_record(record, last.expected),
        "read_header": lambda: store.read_header(record),
        "RecordFile": lambda: store.RecordFile(record, last.expected).verify(),
        "file_sha256": lambda: store.file_sha256(record),
        "weights": lambda: Nitro(KeepLast(), run_dir=run, weights="latest => latest"),
        "resume": lambda: Nitro(KeepLast(max_epochs=3), run_dir=run, resume="auto"),
        "average": lambda: average_checkpoints(run, "latest => Average(Last(2))"),
    }
    for name, call in calls.items():
        with pytest.raises(UnsafePath) as exc:
            call()
        assert str(exc.value) == link_refusal(record), name
    assert store.read_record(run / first.file, first.expected)[1]["epoch"] == 1  # the rest reads


def test_a_record_path_the_caller_names_may_be_a_link(tmp_path):
    run = tmp_path / "run"
    train(run)
    (entry,) = read_manifest(run)
    named = tmp_path / "named.safetensors"
    named.symlink_to(run / entry.file)
    assert checkpoint_info(named)["epoch"] == 1
    n = Nitro(KeepLast(), run_dir=tmp_path / "other", weights=str(named))
    assert n.checkpoint_source == run / entry.file
