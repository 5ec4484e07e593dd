"""Read-ahead off the reader's thread: the request returns at once, the disk is asked for
the pending ranges in turns (readers reading at once are read ahead in turns), and a
reader asks only for the sections it reads."""

from __future__ import annotations

import os
import threading
from collections import deque

import pytest
import torch

from nitro_core.store import readahead, reader
from nitro_core.store import recordio as store

MIB = 1024 * 1024

pytestmark = pytest.mark.skipif(not readahead.AVAILABLE, reason="no posix_fadvise")


def test_pending_ranges_are_advised_a_piece_at_a_time_in_turns():
    pending = deque([(3, 0, 3 * MIB), (4, 10 * MIB, 12 * MIB)])
    order = []
    while pending:
        order.append(readahead.next_piece(pending))
    assert order == [
        (3, 0, MIB),
        (4, 10 * MIB, 11 * MIB),
        (3, MIB, 2 * MIB),
        (4, 11 * MIB, 12 * MIB),
        (3, 2 * MIB, 3 * MIB),
    ]


def test_a_request_returns_before_the_disk_is_asked_and_the_thread_asks_for_all_of_it(
    monkeypatch,
):
    release, advised, done = threading.Event(), [], threading.Event()

    def slow_fadvise(fd, offset, length, advice):
        release.wait(10)  # the disk is busy
        if fd != 99:
            return  # another test's reader, still asking
        advised.append((fd, offset, length, advice))
        if offset + length == 3 * MIB:
            done.set()

    monkeypatch.setattr(os, "posix_fadvise", slow_fadvise)
    readahead.request(99, 0, 3 * MIB)  # returns although the first advice is still blocked
    assert advised == []
    release.set()
    assert done.wait(10)
    assert [(a[1], a[2]) for a in advised] == [(0, MIB), (MIB, MIB), (2 * MIB, MIB)]
    assert {a[3] for a in advised} == {os.POSIX_FADV_WILLNEED}


def test_a_reader_asks_ahead_only_for_the_sections_it_reads(tmp_path, monkeypatch):
    n = 4 * MIB  # floats: 16 MiB of parameters, then 16 MiB of optimizer state
    tensors = {"params/w": torch.ones(n), "optim/state/0/exp_avg": torch.full((n,), 2.0)}
    path = tmp_path / "r.safetensors"
    _, digest = store.write_record(path, tensors, {"step": 1})
    asked = []
    monkeypatch.setattr(readahead, "request", lambda fd, at, length: asked.append((at, length)))
    with reader.RecordFile(path, digest) as record:
        params = next(t for t in record.tensors if t.name == "params/w")
        begin = record.data_start + params.begin
        total = float(record.read({"params"})["params/w"].sum())
    assert total == n
    assert asked, "the reader never asked the kernel to read ahead"
    assert all(begin - begin % 4096 <= at and at + length <= begin + 4 * n for at, length in asked)
    covered = sorted(asked)
    assert covered[0][0] <= begin and covered[-1][0] + covered[-1][1] == begin + 4 * n
