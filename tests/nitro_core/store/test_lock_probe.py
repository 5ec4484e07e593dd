"""The one probe of a lock file (:func:`nitro_core.store.safeio.lock_held`): a run's
training lock (deletion refuses a run being trained) and a record's write claim (a live
writer's leftovers are never set aside) are both asked through it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from nitro_core.errors import UnsafePath
from nitro_core.store.claims import in_flight, run_lock, run_lock_path
from nitro_core.store.safeio import link_refusal, lock_held


def test_a_held_lock_is_seen_a_free_or_missing_one_is_not_and_nothing_is_created(tmp_path):
    path = run_lock_path(tmp_path, "abcd1234")
    assert lock_held(path) is False and not path.exists()  # probed, never created
    with run_lock(tmp_path, "abcd1234") as mine:
        assert mine and lock_held(path) is True  # another open file holds it
        assert in_flight(path) is True
    assert lock_held(path) is False and in_flight(path) is False


def test_the_probe_leaves_a_free_lock_free(tmp_path):
    path = tmp_path / "free.lock"
    path.touch()
    assert lock_held(path) is False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the probe dropped its lock
    finally:
        os.close(fd)


def test_a_link_is_refused_by_the_probe_and_holds_no_write_claim(tmp_path: Path):
    (tmp_path / "target").touch()
    link = tmp_path / "x.safetensors.tmp"
    link.symlink_to(tmp_path / "target")
    with pytest.raises(UnsafePath) as exc:
        lock_held(link)
    assert str(exc.value) == str(link_refusal(link))
    assert in_flight(link) is False  # a leftover link: no writer holds it
