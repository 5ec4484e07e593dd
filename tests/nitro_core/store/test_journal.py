"""The manifest journal: a checkpoint's manifest change is one appended line once the
manifest is large (its first change starts the journal, durable before manifest.json names
it), the journal is folded into ``manifest.json`` at a quarter of its size and removed at the
end of a run, only a last line without its newline counts as torn, any complete line that
fails its check is corruption (refused with its byte offset, nothing written), and a journal
that does not continue the manifest beside it (missing, empty, another's) is refused.
Processes and SIGKILLs: test_journal_processes.py."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nitro_core import CheckpointCorrupt, Nitro, delete_checkpoints, read_manifest
from nitro_core.store import journal, manifest
from nitro_core.store import recordio as store

from .._journal_procs import entry
from ..tiny import KeepLast

REPO = Path(__file__).resolve().parents[3]


def build(d: Path, n: int, run: str = "abcd1234") -> None:
    """A complete manifest.json listing ``entry(1..n)``."""
    with store.manifest_lock(d):
        manifest.save(d, manifest.Manifest(entries=[entry(i, run) for i in range(1, n + 1)]))


def change(d: Path, add: int | None = None, drop: int | None = None) -> None:
    with store.manifest_lock(d):
        manifest.commit(
            d,
            add=[] if add is None else [entry(add)],
            drop=[] if drop is None else [entry(drop).file],
        )


def fresh(d: Path) -> list[str]:
    """The files listed, as a process that never saw the directory reads them (this
    process's own view, which its next write starts from, is left as it was)."""
    held = dict(manifest._SEEN)
    manifest._SEEN.clear()
    try:
        return [e.file for e in read_manifest(d)]
    finally:
        manifest._SEEN.clear()
        manifest._SEEN.update(held)


def files(*numbers: int) -> list[str]:
    return [entry(i).file for i in numbers]


def lines(d: Path) -> list[bytes]:
    return (d / journal.NAME).read_bytes().splitlines(keepends=True)


def document(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_bytes())


@pytest.fixture
def large(monkeypatch):
    monkeypatch.setattr(manifest, "SMALL", 0)  # every manifest counts as large


@pytest.fixture
def journaled(tmp_path, large):
    """200 entries, and a journal started by the change that added the 200th."""
    build(tmp_path, 199)
    change(tmp_path, add=200)
    return tmp_path


def test_a_change_to_a_large_manifest_is_one_journal_line(journaled):
    d = journaled
    before = (d / "manifest.json").read_bytes()
    change(d, add=201, drop=1)
    assert (d / "manifest.json").read_bytes() == before  # not rewritten
    header, line = lines(d)
    assert json.loads(header[17:]) == {
        "format": journal.FORMAT,
        "after": document(d)["journal"],
        "id": document(d)["journal_id"],
    }
    assert json.loads(line[17:])["seq"] == document(d)["journal"] + 1
    assert fresh(d) == files(*range(2, 202))


def test_a_large_manifest_s_first_change_starts_its_journal_durably_before_naming_it(
    tmp_path, large, monkeypatch
):
    d = tmp_path
    build(d, 200)
    assert "journal_id" not in document(d) and not (d / journal.NAME).exists()
    events: list[tuple[str, object]] = []
    real_replace, real_fsync = os.replace, os.fsync
    monkeypatch.setattr(
        os, "replace", lambda a, b: events.append(("replace", Path(b).name)) or real_replace(a, b)
    )
    monkeypatch.setattr(
        os, "fsync", lambda fd: events.append(("fsync", os.fstat(fd).st_ino)) or real_fsync(fd)
    )
    change(d, add=201)
    directory = ("fsync", d.stat().st_ino)
    started, named = (
        events.index(("replace", journal.NAME)),
        events.index(("replace", "manifest.json")),
    )
    assert started < events.index(directory, started) < named  # durable before it is named
    (header,) = lines(d)  # the change itself is in manifest.json
    assert json.loads(header[17:]) == {
        "format": journal.FORMAT,
        "after": document(d)["journal"],
        "id": document(d)["journal_id"],
    }
    assert fresh(d) == files(*range(1, 202))
    change(d, add=202)
    assert len(lines(d)) == 2
    assert fresh(d) == files(*range(1, 203))


def test_the_journal_is_folded_into_the_manifest_at_a_quarter_of_its_size(journaled):
    d = journaled
    ident = document(d)["journal_id"]
    size = (d / "manifest.json").stat().st_size
    i = 200
    while (d / journal.NAME).stat().st_size <= size // 4:
        i += 1
        change(d, add=i)
    change(d, add=i + 1)  # the one that compacts
    assert len(lines(d)) == 1  # a header alone
    assert document(d)["journal"] == manifest.load(d).journal and document(d)["journal_id"] == ident
    assert fresh(d) == files(*range(1, i + 2))


@pytest.mark.parametrize("n", range(1, 11))
def test_compaction_at_every_count_keeps_every_change_exactly_once(tmp_path, large, n):
    """Twelve entries: the journal is folded in every few changes; after ``n`` changes each
    reader, and a second writer, sees every change once, wherever the count falls."""
    d = tmp_path
    build(d, 12)
    for i in range(13, 13 + n):
        change(d, add=i, drop=i - 12)
        assert fresh(d) == files(*range(i - 11, i + 1)), i
    manifest._SEEN.clear()
    change(d, add=100)  # a second writer: it never saw the directory
    assert fresh(d) == files(*range(n + 1, n + 13), 100)
    manifest.compact(d)
    assert not (d / journal.NAME).exists() and "journal_id" not in document(d)
    assert fresh(d) == files(*range(n + 1, n + 13), 100)


def test_compact_makes_manifest_json_complete_on_its_own(journaled):
    d = journaled
    change(d, add=201)
    manifest.compact(d)
    assert not (d / journal.NAME).exists() and "journal_id" not in document(d)
    assert [e["file"] for e in document(d)["entries"]] == files(*range(1, 202))
    assert fresh(d) == files(*range(1, 202))


def test_a_run_ends_with_its_manifest_compacted(tmp_path, large):
    build(tmp_path, 200, run="00000000")  # another run's: this run's changes are journal lines
    Nitro(KeepLast(max_epochs=2), run_dir=tmp_path).train().logger.close()
    assert not (tmp_path / journal.NAME).exists() and "journal_id" not in document(tmp_path)
    assert len(document(tmp_path)["entries"]) == len(fresh(tmp_path)) == 202


def test_a_torn_last_line_never_counted_and_is_cut_by_the_next_writer(journaled):
    d = journaled
    change(d, add=201)
    seq = document(d)["journal"] + 2
    with open(d / journal.NAME, "ab") as f:
        f.write(journal.line({"seq": seq, "add": [entry(202).model_dump(mode="json")]})[:-1])
    assert fresh(d)[-1] == entry(201).file  # no final newline: never committed
    change(d, add=203)
    assert fresh(d)[-2:] == files(201, 203)
    assert len(lines(d)) == 3


def _flip_checksum(raw: bytearray, at: int) -> None:
    raw[at] = ord("0") if raw[at] != ord("0") else ord("1")


def _flip_json(raw: bytearray, at: int) -> None:
    raw[at + 30] ^= 0x01


def _misnumber(raw: bytearray, at: int) -> None:
    obj = json.loads(raw[at + 17 : -1])
    raw[at:] = journal.line({**obj, "seq": obj["seq"] + 1})  # a valid line, out of sequence


def _corrupt(d: Path, at: int) -> str:
    p = str(d / journal.NAME)
    return (
        f"Manifest journal {p!r} is corrupt at byte {at}: the line there ends in a newline, so "
        "it was committed, but it fails its check (a write cut short never ends in one). "
        "Nothing was deleted, and nothing is written to this directory while it is corrupt. "
        f"Restore manifest.journal from a backup, or keep the changes before that line with "
        f"`truncate -s {at} {p!r}` (the changes from it on are lost)."
    )


@pytest.mark.parametrize("damage", [_flip_checksum, _flip_json, _misnumber])
def test_a_complete_last_line_that_fails_its_check_is_corruption_and_nothing_is_written(
    journaled, damage
):
    d = journaled
    change(d, add=201, drop=1)
    change(d, add=202, drop=2)
    for i in range(1, 203):
        (d / entry(i).file).write_bytes(b"record")
    raw = bytearray((d / journal.NAME).read_bytes())
    last = raw.rindex(b"\n", 0, len(raw) - 1) + 1
    damage(raw, last)
    (d / journal.NAME).write_bytes(bytes(raw))
    on_disk = {p.name: p.read_bytes() for p in d.iterdir()}
    with pytest.raises(CheckpointCorrupt) as exc:
        fresh(d)
    assert str(exc.value) == _corrupt(d, last)
    for attempt in (
        lambda: change(d, add=203, drop=3),
        lambda: manifest.compact(d),
        lambda: delete_checkpoints(d, files=[entry(3).file], dry_run=False),
    ):
        with pytest.raises(CheckpointCorrupt) as exc:
            attempt()
        assert str(exc.value) == _corrupt(d, last)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == on_disk  # nothing written or deleted


def test_a_bad_line_before_the_last_is_corruption(journaled):
    d = journaled
    for i in (201, 202):
        change(d, add=i)
    raw = bytearray((d / journal.NAME).read_bytes())
    first_change = raw.index(b"\n") + 1
    raw[first_change + 30] ^= 0x01
    (d / journal.NAME).write_bytes(bytes(raw))
    with pytest.raises(CheckpointCorrupt) as exc:
        fresh(d)
    assert str(exc.value) == _corrupt(d, first_change)


def test_a_journal_changed_in_place_under_a_reader_that_holds_it_is_read_again(journaled):
    """A reader keeps what it parsed and reads only what was appended since, once the bytes
    it ends on are still there: a journal rewritten in place (or a new one on a reused inode)
    that grew is read in full."""
    d = journaled
    change(d, add=201)
    assert read_manifest(d)[-1].file == entry(201).file  # held by this process now
    raw = bytearray((d / journal.NAME).read_bytes())
    last = raw.rindex(b"\n", 0, len(raw) - 1) + 1
    raw[len(raw) - 10] ^= 0x01  # its last line changed near its end...
    seq = document(d)["journal"] + 2
    raw += journal.line(
        {"seq": seq, "add": [entry(202).model_dump(mode="json")]}
    )  # ...and one more
    with open(d / journal.NAME, "r+b") as f:  # in place: the same inode
        f.write(raw)
    with pytest.raises(CheckpointCorrupt) as exc:
        read_manifest(d)
    assert str(exc.value) == _corrupt(d, last)


def test_a_header_that_fails_its_check_is_corruption_at_byte_0(journaled):
    d = journaled
    raw = bytearray((d / journal.NAME).read_bytes())
    raw[30] ^= 0x01
    (d / journal.NAME).write_bytes(bytes(raw))
    with pytest.raises(CheckpointCorrupt) as exc:
        fresh(d)
    assert str(exc.value) == (
        f"Manifest journal {str(d / journal.NAME)!r} is corrupt at byte 0: its header ends in a "
        "newline, so it was committed, but it fails its check (a write cut short never ends in "
        "one). Nothing was deleted, and nothing is written to this directory while it is "
        "corrupt. Restore manifest.journal from a backup."
    )


def _remove(d: Path, other: Path) -> None:
    (d / journal.NAME).unlink()


def _empty(d: Path, other: Path) -> None:
    (d / journal.NAME).write_bytes(b"")


def _foreign(d: Path, other: Path) -> None:
    shutil.copyfile(other / journal.NAME, d / journal.NAME)


def _without_identity(d: Path, other: Path) -> None:
    header, *rest = lines(d)
    obj = json.loads(header[17:])
    del obj["id"]
    (d / journal.NAME).write_bytes(journal.line(obj) + b"".join(rest))


def _refused(d: Path, what: str, fix: str) -> str:
    doc = document(d)
    return (
        f"Manifest {str(d / 'manifest.json')!r} says that the changes committed after its change "
        f"{doc['journal']} are in {str(d / journal.NAME)!r} (journal {doc['journal_id']}), but "
        f"{what}. It is refused rather than read as manifest.json alone, which would silently "
        "drop those changes (a resume would go back, and retention would act on an old list). "
        "Nothing was deleted. Restore manifest.journal from a backup of this directory; to "
        f"accept losing the changes since manifest.json was last rewritten, {fix}."
    )


@pytest.mark.parametrize(
    ("damage", "what", "fix"),
    [
        (_remove, "that file is missing", 'remove its "journal_id" key'),
        (
            _empty,
            "that file is empty (it holds no complete line)",
            'remove its "journal_id" key and remove manifest.journal',
        ),
        (
            _foreign,
            "that file is another manifest's journal (its header names journal {other})",
            'remove its "journal_id" key and remove manifest.journal',
        ),
        (
            _without_identity,
            "that file is another manifest's journal (its header names no journal: it was "
            "written before journals had one)",
            'remove its "journal_id" key and remove manifest.journal',
        ),
    ],
    ids=["missing", "empty", "foreign", "without-identity"],
)
def test_a_journal_that_does_not_continue_the_manifest_naming_it_is_refused(
    journaled, tmp_path_factory, damage, what, fix
):
    d = journaled
    change(d, add=201, drop=1)
    other = tmp_path_factory.mktemp("other")  # another run directory, with its own journal
    build(other, 199)
    change(other, add=200)
    change(other, add=201)
    damage(d, other)
    on_disk = {p.name: p.read_bytes() for p in d.iterdir()}
    other_id = document(other)["journal_id"]
    expected = _refused(d, what.format(other=other_id), fix)
    attempts = [lambda: fresh(d), lambda: change(d, add=202)]
    if damage is not _remove:  # (without a journal, the end of a run has nothing to fold in)
        attempts.append(lambda: manifest.compact(d))
    for attempt in attempts:
        with pytest.raises(CheckpointCorrupt) as exc:
            attempt()
        assert str(exc.value) == expected
    assert {p.name: p.read_bytes() for p in d.iterdir()} == on_disk


def test_a_journal_past_a_manifest_that_names_none_is_refused(tmp_path, large):
    d = tmp_path
    build(d, 200)
    old = (d / "manifest.json").read_bytes()  # complete, before the journal started
    for i in (201, 202, 203):
        change(d, add=i)
    ident, last = document(d)["journal_id"], document(d)["journal"]
    (d / "manifest.json").write_bytes(old)  # an older manifest.json restored
    with pytest.raises(CheckpointCorrupt) as exc:
        fresh(d)
    assert str(exc.value) == (
        f"Manifest journal {str(d / journal.NAME)!r} holds changes {last + 1} to {last + 2}, "
        f"past the last change of {str(d / 'manifest.json')!r} (0), but manifest.json names no "
        f"journal: this one (journal {ident}) continues another copy of it (an older "
        "manifest.json restored, or a journal copied in from another directory). Nothing was "
        "deleted. Restore both files from the same backup, or remove manifest.journal to keep "
        "manifest.json as it is (those changes are lost)."
    )


def test_a_manifest_older_than_its_journal_is_refused(journaled):
    d = journaled
    old, held = (d / "manifest.json").read_bytes(), document(d)["journal"]
    size = len(old)
    i = 200
    while (d / journal.NAME).stat().st_size <= size // 4:
        i += 1
        change(d, add=i)
    change(d, add=i + 1)  # a compaction: the journal now starts after it
    after = document(d)["journal"]
    (d / "manifest.json").write_bytes(old)
    with pytest.raises(CheckpointCorrupt) as exc:
        fresh(d)
    assert str(exc.value) == (
        f"Manifest {str(d / 'manifest.json')!r} holds the changes up to {held}, but its journal "
        f"{str(d / journal.NAME)!r} starts after change {after}: changes {held + 1} to {after} "
        "are in neither file (manifest.json is older than its journal: restored from an older "
        "copy?). Nothing was deleted. Restore both files from the same backup."
    )


def test_a_resume_beside_a_damaged_journal_is_refused_instead_of_going_back(
    tmp_path, large, monkeypatch
):
    """The journal's last line holds the last record and the eviction of an older one: read
    as torn, the manifest listed the deleted record and not the newest, and resume="auto"
    went back one epoch; read without the journal, it failed with "evicted by retention"."""
    build(tmp_path, 200, run="00000000")  # another run's: this run's changes are journal lines
    monkeypatch.setattr(manifest, "compact", lambda d: None)  # as a run killed at its end leaves it
    Nitro(KeepLast(max_epochs=3), run_dir=tmp_path).train().logger.close()
    monkeypatch.undo()
    monkeypatch.setattr(manifest, "SMALL", 0)
    raw = bytearray((tmp_path / journal.NAME).read_bytes())
    last = raw.rindex(b"\n", 0, len(raw) - 1) + 1
    assert b'"epoch":3' in raw[last:]
    raw[last + 40] ^= 0x01
    (tmp_path / journal.NAME).write_bytes(bytes(raw))
    on_disk = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(CheckpointCorrupt) as exc:
        Nitro(KeepLast(max_epochs=4), run_dir=tmp_path, resume="auto").train()
    assert str(exc.value) == _corrupt(tmp_path, last)
    (tmp_path / journal.NAME).unlink()
    with pytest.raises(CheckpointCorrupt) as exc:
        Nitro(KeepLast(max_epochs=4), run_dir=tmp_path, resume="auto").train()
    assert str(exc.value) == _refused(
        tmp_path, "that file is missing", 'remove its "journal_id" key'
    )
    now = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert now == {k: v for k, v in on_disk.items() if k != journal.NAME}  # nothing deleted


def test_a_journal_line_is_fsynced_before_its_commit_returns(journaled, monkeypatch):
    d = journaled
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.fstat(fd).st_ino) or real(fd))
    change(d, add=201)
    assert (d / journal.NAME).stat().st_ino in synced


def test_a_compaction_killed_before_the_journal_is_emptied_applies_nothing_twice(
    journaled, monkeypatch
):
    d = journaled
    size = (d / "manifest.json").stat().st_size
    i = 200
    while (d / journal.NAME).stat().st_size <= size // 4:
        i += 1
        change(d, add=i, drop=i - 200)
    monkeypatch.setattr(journal, "reset", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):  # killed after manifest.json, before the journal
        change(d, add=i + 1, drop=i + 1 - 200)
    monkeypatch.undo()
    monkeypatch.setattr(manifest, "SMALL", 0)
    assert len(lines(d)) > 1  # still there, every line already absorbed
    assert fresh(d) == files(*range(i + 2 - 200, i + 2))
    change(d, add=i + 2)
    assert fresh(d) == files(*range(i + 2 - 200, i + 3))


def test_a_manifest_rewritten_within_one_timestamp_tick_is_read_again(tmp_path):
    build(tmp_path, 3)
    path = tmp_path / "manifest.json"
    # its modification time is set ahead, so it is within the racy window of every read this
    # test makes however slow the machine is (a real one is within a tick of its read)
    ahead = time.time_ns() + 3600 * 10**9
    os.utime(path, ns=(ahead, ahead))
    manifest._SEEN.clear()
    assert len(read_manifest(tmp_path)) == 3  # now held by this process
    st = path.stat()
    edited = path.read_bytes().replace(b'"bytes": 2,', b'"bytes": 7,')
    path.write_bytes(edited)  # same size, and the same mtime as what was read
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_ino == st.st_ino and path.stat().st_size == st.st_size
    assert [e.bytes for e in read_manifest(tmp_path)] == [1, 7, 3]


# -- SIGKILL during appends and compactions, at random moments -------------------------------------
CHILD = """
import sys
from pathlib import Path
from nitro_core.store import manifest, recordio as store
from tests.nitro_core._journal_procs import entry
d, start = Path(sys.argv[1]), int(sys.argv[2])
manifest.SMALL = 0
for i in range(start, start + 100000):
    with store.manifest_lock(d):
        manifest.commit(d, add=[entry(i)], drop=[entry(i - 150).file])
    print(i, flush=True)
    if i % 7 == 0:
        manifest.compact(d)
"""


@pytest.mark.slow
def test_sigkill_during_appends_and_compactions_keeps_exactly_the_committed_entries(tmp_path):
    build(tmp_path, 150)
    rnd = random.Random(13)
    start = 151
    for _ in range(12):
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path), str(start)],
            cwd=REPO, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        first = proc.stdout.readline()  # it runs: the first change is committed
        assert first.strip() == str(start), first
        time.sleep(rnd.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        done = [start, *map(int, out.split())]
        last = done[-1]
        listed = fresh(tmp_path)
        committed = [entry(i).file for i in range(last - 149, last + 1)]
        # every change that returned is there; the one in flight may or may not be
        assert listed in (committed, committed[1:] + [entry(last + 1).file]), (last, listed[-3:])
        start = last + 2 if listed[-1] == entry(last + 1).file else last + 1


@pytest.mark.parametrize("byte", [0x0B, 0x00, 0x20])
@pytest.mark.parametrize("which", ["last", "middle"])
def test_a_committed_line_whose_newline_byte_changed_is_still_committed(journaled, byte, which):
    """A complete line whose check verifies is committed whatever byte follows it: its
    newline flipped (0x0A -> 0x0B) once dropped the newest record; the next writer appends
    after it and every change is read once."""
    d = journaled
    change(d, add=201)
    change(d, add=202)
    raw = bytearray((d / journal.NAME).read_bytes())
    newline = len(raw) - 1 if which == "last" else raw.rindex(b"\n", 0, len(raw) - 1)
    raw[newline] = byte
    (d / journal.NAME).write_bytes(bytes(raw))
    assert fresh(d)[-2:] == files(201, 202)
    change(d, add=203)
    assert fresh(d)[-3:] == files(201, 202, 203)
    manifest.compact(d)
    assert fresh(d)[-3:] == files(201, 202, 203) and len(fresh(d)) == 203
