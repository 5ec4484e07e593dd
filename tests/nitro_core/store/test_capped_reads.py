"""``safeio.read_capped``, in-process with small limits in place of READ_LIMITS' (a claim's
limit set to 10 bytes here): a file of exactly its limit is read, one byte more is refused
before a byte is read, and the rest of a file read from an offset is what is measured."""

from __future__ import annotations

import os

import pytest

from nitro_core.errors import RecordError
from nitro_core.store import safeio


@pytest.fixture
def ten_bytes(monkeypatch):
    monkeypatch.setitem(safeio.READ_LIMITS, "claim", 10)


def _refusal(size: int) -> str:
    return (
        f"Refusing to read the claim 'c.json': it is {size} bytes, over the 10 bytes (0 MiB) "
        "Nitro reads of a claim, far more than Nitro ever writes, so it was not written by "
        "Nitro or is damaged. Move it aside (or restore it from a backup) and call again."
    )


def test_a_file_of_exactly_its_limit_is_read_and_one_byte_more_is_refused(tmp_path, ten_bytes):
    (tmp_path / "ten").write_bytes(b"0123456789")
    (tmp_path / "eleven").write_bytes(b"0123456789A")
    with open(tmp_path / "ten", "rb") as f:
        assert safeio.read_capped(f, "claim", "c.json") == b"0123456789"
    with open(tmp_path / "eleven", "rb") as f, pytest.raises(RecordError) as caught:
        safeio.read_capped(f, "claim", "c.json")
    assert str(caught.value) == _refusal(11)


def test_a_size_told_by_the_caller_is_checked_before_reading(tmp_path, ten_bytes):
    (tmp_path / "f").write_bytes(b"abc")
    with open(tmp_path / "f", "rb") as f:
        with pytest.raises(RecordError) as caught:
            safeio.read_capped(f, "claim", "c.json", size=11)
        assert f.tell() == 0  # refused before a byte was read
    assert str(caught.value) == _refusal(11)
    with open(tmp_path / "f", "rb") as f:
        assert safeio.read_capped(f, "claim", "c.json", size=10) == b"abc"


def test_a_file_longer_than_its_size_said_is_refused_by_what_a_read_returns(tmp_path, ten_bytes):
    (tmp_path / "f").write_bytes(b"x" * 25)
    with open(tmp_path / "f", "rb") as f, pytest.raises(RecordError) as caught:
        safeio.read_capped(f, "claim", "c.json", size=3)  # it grew since it was measured
    assert str(caught.value) == _refusal(11)


def test_what_is_measured_is_the_rest_of_the_file_from_where_it_is_read(tmp_path, ten_bytes):
    (tmp_path / "f").write_bytes(b"H" * 15 + b"0123456789")
    with open(tmp_path / "f", "rb") as f:
        f.seek(15)  # a header read first: ten bytes are left
        assert safeio.read_capped(f, "claim", "c.json") == b"0123456789"
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        f.read(14)
        with pytest.raises(RecordError, match="it is 11 bytes, over the 10 bytes"):
            safeio.read_capped(f, "claim", "c.json")
