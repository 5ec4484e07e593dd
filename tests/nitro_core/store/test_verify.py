"""``verify`` (``nitro verify PATH|DIR``, the ``nitro_verify`` tool) checks every byte of
every record it is given, files and record directories alike: listed ones against the
manifest, unlisted ones against their own header's digest, each kind of damage by the file
it is in; a directory of run directories run by run; nothing found is said."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import xxhash

from nitro_core import (
    CheckpointCorrupt,
    CheckpointMissing,
    Nitro,
    average_checkpoints,
    checkpoint_info,
    delete_checkpoints,
    read_manifest,
    verify,
)
from nitro_core.store import recordio as store
from nitro_core.store import shards
from nitro_mcp.cli import main

from .. import by_hand
from ..sharded_runs import to_record_directories
from ..tiny import KeepLast


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
    assert out[-1] == "2 record(s) checked, 0 corrupt"
    assert out[0].startswith("ok       epoch-") and out[0].endswith(": optim, params, rng")
    flip_params(run / read_manifest(run)[0].file)
    assert main(["verify", str(run)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("CORRUPT  epoch-") and out[-1] == "2 record(s) checked, 1 corrupt"


def test_nitro_verify_help_has_a_summary_and_an_example():
    out = subprocess.run(
        [sys.executable, "-m", "nitro_mcp.cli", "verify", "--help"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "check every byte of a record, or of a run directory's records" in out
    assert "example:\n  nitro verify runs/Classifier" in out


# -- record directories (an FSDP run's: header.json and one shard per rank) ------------------
@pytest.fixture
def sharded(run) -> tuple[Path, list[Path]]:
    """``run`` with both its records rewritten as record directories of two shards."""
    return run, to_record_directories(run)


def test_a_run_of_record_directories_verifies_every_one_listed_and_unlisted(sharded):
    run, (first, second) = sharded
    shutil.copytree(second, run / "copied-out")  # a record directory no manifest lists
    checks = verify(run)
    assert [(c.file, c.listed, c.ok, c.problem) for c in checks] == [
        (first.name, True, True, None),
        (second.name, True, True, None),
        ("copied-out", False, True, None),
    ]
    assert checks[0].sections == ["optim", "params", "rng"]
    assert checks[0].bytes == sum(p.stat().st_size for p in first.iterdir())
    (check,) = verify(first)  # one record directory, named: with its manifest entry
    assert (check.file, check.listed, check.ok) == (str(first), True, True)
    assert main(["verify", str(run)]) == 0


def _shard(record: Path, rank: int) -> Path:
    return record / f"shard-{rank:05d}-model-00001-of-00001.safetensors"


def _edit_header(record: Path) -> None:
    """Change one value of header.json in place (the same length, still valid JSON)."""
    header = record / "header.json"
    raw = header.read_bytes()
    assert b'"epoch": 2' in raw
    header.write_bytes(raw.replace(b'"epoch": 2', b'"epoch": 7', 1))


def _damage(kind: str, record: Path, tmp_path: Path) -> None:
    one, two = _shard(record, 1), _shard(record, 2)
    if kind == "missing shard":
        two.unlink()
    elif kind == "extra shard":
        shutil.copyfile(two, _shard(record, 3))
    elif kind == "truncated shard":
        two.write_bytes(two.read_bytes()[:-5])
    elif kind == "flipped shard":
        raw = bytearray(two.read_bytes())
        raw[-1] ^= 0x01
        two.write_bytes(bytes(raw))
    elif kind == "symlinked shard":
        outside = tmp_path / "outside.safetensors"
        shutil.copyfile(two, outside)  # the same bytes, but not in the record
        two.unlink()
        two.symlink_to(outside)
    elif kind == "swapped shards":
        aside = record / "aside"
        one.rename(aside)
        two.rename(one)
        aside.rename(two)
    elif kind == "edited header":
        _edit_header(record)
    elif kind == "deleted header":
        (record / "header.json").unlink()
    elif kind == "linked header":
        shutil.copyfile(record / "header.json", tmp_path / "header.json")  # the same bytes
        (record / "header.json").unlink()
        (record / "header.json").symlink_to(tmp_path / "header.json")
    elif kind == "header is a directory":
        (record / "header.json").unlink()
        (record / "header.json").mkdir()
    elif kind == "shard is a directory":
        two.unlink()
        two.mkdir()
    elif kind == "record is a link":
        shutil.copytree(record, tmp_path / "elsewhere")
        shutil.rmtree(record)
        record.symlink_to(tmp_path / "elsewhere")
    else:
        raise AssertionError(kind)


def _problem(kind: str, record: Path, listed: bool) -> str:
    one, two = _shard(record, 1).name, _shard(record, 2).name
    where = f"Checkpoint {str(record)!r}"
    return {
        "missing shard": f"{where} is missing the shard {two!r} its header.json lists (1 of 2 "
        "shard files missing). Load another checkpoint.",
        "extra shard": f"{where} holds {_shard(record, 3).name!r}, which its header.json does "
        "not list (1 file(s) added since it was written). Load another checkpoint.",
        "truncated shard": f"{where}: shard {two!r} is truncated: it ends 5 bytes short of "
        "what its safetensors header describes. Load another checkpoint.",
        "flipped shard": f"{where}: shard {two!r} does not match the digest its header gives; "
        "it changed since it was written. Load another checkpoint.",
        "symlinked shard": f"{where}: shard {two!r} is a symbolic link, not the file its rank "
        "wrote; Nitro never reads a shard through a link (it could lead outside the run "
        "directory). Load another checkpoint.",
        "swapped shards": f"{where}: shard {one!r} holds the bytes of shard {two!r} (the shard "
        "files were swapped or copied over each other since they were written). Load "
        "another checkpoint.",
        "deleted header": f"{record.name!r} is listed by the manifest, but its header.json is "
        "not on disk (deleted since it was written), so its shards cannot be checked. Load "
        "another checkpoint."
        if listed
        else f"{record.name!r} is a directory of shard files without header.json: not a "
        "committed record (deleted header, or a copy that lost it). Load another checkpoint.",
        "linked header": f"Refusing to open {str(record / 'header.json')!r}: it is a symbolic "
        "link, and Nitro never follows a link for a file it keeps in a run directory (it could "
        "lead outside it). Replace the link by the real file, or remove it.",
        "header is a directory": f"{where}: its header.json is a directory, not the file rank "
        "0 wrote, so its shards cannot be checked. Load another checkpoint.",
        "shard is a directory": f"{where}: shard {two!r} is a directory, not the file its rank "
        "wrote. Load another checkpoint.",
        "record is a link": f"Refusing to open {str(record)!r}: it is a symbolic link, and "
        "Nitro never follows a link for a file it keeps in a run directory (it could lead "
        "outside it). Replace the link by the real file, or remove it.",
    }[kind]


DAMAGE = [
    "missing shard", "extra shard", "truncated shard", "flipped shard", "symlinked shard",
    "swapped shards", "edited header", "deleted header", "linked header",
    "header is a directory", "shard is a directory", "record is a link",
]  # fmt: skip


@pytest.mark.parametrize("kind", DAMAGE)
def test_each_damage_to_a_listed_record_directory_is_named_by_its_file(sharded, tmp_path, kind):
    run, (first, second) = sharded
    _damage(kind, second, tmp_path)
    checks = {c.file: c for c in verify(run)}
    assert checks[first.name].ok and not checks[second.name].ok
    if kind == "edited header":  # listed: against the manifest's digest of header.json
        tree = read_manifest(run)[1].digest
        assert tree is not None
        expected = (
            f"Checkpoint {str(second)!r}: its header.json does not match the manifest's digest "
            f"({tree[:30]}...); the record changed since it was written. Load another "
            "checkpoint."
        )
    else:
        expected = _problem(kind, second, listed=True)
    assert checks[second.name].problem == expected
    assert main(["verify", str(run)]) == 1


@pytest.mark.parametrize("kind", [k for k in DAMAGE if k != "record is a link"])
def test_each_damage_to_an_unlisted_record_directory_is_named_by_its_file(sharded, tmp_path, kind):
    run, (_, second) = sharded
    unlisted = run / "copied-out"
    shutil.copytree(second, unlisted)
    _damage(kind, unlisted, tmp_path)
    checks = {c.file: c for c in verify(run)}
    if kind == "edited header":  # unlisted: against the digest header.json carries
        header = json.loads((unlisted / "header.json").read_bytes())
        recorded = header["integrity"]["header"]
        zeroed = {**header, "integrity": {**header["integrity"], "header": "0" * 32}}
        actual = xxhash.xxh3_128(json.dumps(zeroed, sort_keys=True).encode()).hexdigest()
        assert actual != recorded
        assert checks["copied-out"].problem == (
            f"Checkpoint {str(unlisted)!r}: its header.json digests to xxh3-128:{actual[:16]}..., "
            f"its integrity block recorded xxh3-128:{recorded[:16]}... when it was written (the "
            "header was edited since). Load another checkpoint."
        )
    else:
        assert checks["copied-out"].problem == _problem(kind, unlisted, listed=False)
    assert [c.ok for c in checks.values()] == [True, True, False]


def test_a_record_directory_without_its_header_is_missing_to_every_loader(sharded):
    run, (_, second) = sharded
    (second / "header.json").unlink()
    expected = (
        f"Checkpoint {str(second)!r} is a directory without header.json, so not a committed "
        "sharded record (a write interrupted before its commit leaves '<name>.tmp'). Load "
        "another checkpoint."
    )
    entry = read_manifest(run)[1]
    calls = {
        "read_header": lambda: store.read_header(second),
        "read_record": lambda: store.read_record(second, entry.expected),
        "open_record_file": lambda: store.open_record_file(second),
        "manifest_digest": lambda: shards.manifest_digest(second),
        "checkpoint_info": lambda: checkpoint_info(second),
    }
    for name, call in calls.items():
        with pytest.raises(CheckpointMissing) as exc:
            call()
        assert str(exc.value) == expected, name


# -- a header no manifest vouches for carries its own digest ----------------------------------
def test_an_edited_header_of_a_record_no_manifest_lists_is_refused(run):
    path = run / "avg.safetensors"
    average_checkpoints(run, "latest => Average(Last(2))", save=path)
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    at = raw.index(b'\\"seed\\":', 0, 8 + n) + len(b'\\"seed\\":')
    raw[at] = ord("7") if raw[at] != ord("7") else ord("8")  # the same length, still JSON
    path.write_bytes(bytes(raw))
    recorded = json.loads(json.loads(raw[8 : 8 + n])["__metadata__"]["nitro"])["integrity"]
    actual = by_hand.header_digest(path)
    expected = (
        f"Checkpoint {str(path)!r} is corrupt: its header digests to xxh3-128:{actual[:16]}..., "
        f"its integrity block recorded xxh3-128:{recorded['header'][:16]}... when it was "
        "written (the header was edited since). Load another checkpoint or restore this file "
        "from a backup."
    )
    for name, call in {
        "checkpoint_info": lambda: checkpoint_info(path),
        "read_record": lambda: store.read_record(path),
        "weights": lambda: Nitro(KeepLast(), run_dir=run.parent / "other", weights=str(path)),
    }.items():
        with pytest.raises(CheckpointCorrupt) as exc:
            call()
        assert str(exc.value) == expected, name
    assert {c.file: c.problem for c in verify(run)}["avg.safetensors"] == expected


def _unsealed(path: Path) -> str:
    return (
        f"Checkpoint {str(path)!r} is corrupt: its header carries no digest of its own "
        "(integrity.header, first in its nitro metadata), yet it says format_version 2, "
        "written with one (a record written before header digests says 1); the header was "
        "edited since. Load another checkpoint or restore this file from a backup."
    )


@pytest.mark.parametrize("how", ["key renamed", "block removed"])
def test_a_header_that_claims_its_own_digest_and_carries_none_is_refused(run, how):
    from safetensors.torch import save_file

    path = run / "avg.safetensors"
    average_checkpoints(run, "latest => Average(Last(2))", save=path)
    if how == "key renamed":  # one byte: "integrity" -> "integritx", still JSON
        raw = bytearray(path.read_bytes())
        raw[raw.index(b"integrity") + 8] = ord("x")
        raw[-1] ^= 0x01  # and a tensor byte, which no section digest would check any more
        path.write_bytes(bytes(raw))
    else:  # the block removed: the header rewritten without it
        tensors, meta = store.read_record(path)
        del meta["integrity"]
        save_file(tensors, str(path), metadata={"nitro": json.dumps(meta)})
    for name, call in {
        "checkpoint_info": lambda: checkpoint_info(path),
        "read_record": lambda: store.read_record(path),
        "weights": lambda: Nitro(KeepLast(), run_dir=run.parent / "other", weights=str(path)),
    }.items():
        with pytest.raises(CheckpointCorrupt) as exc:
            call()
        assert str(exc.value) == _unsealed(path), name
    assert {c.file: c.problem for c in verify(run)}["avg.safetensors"] == _unsealed(path)


def test_a_header_json_that_claims_its_own_digest_and_carries_none_is_refused(sharded):
    run, (_, second) = sharded
    unlisted = run / "copied-out"
    shutil.copytree(second, unlisted)
    header = json.loads((unlisted / "header.json").read_bytes())
    del header["integrity"]
    header["epoch"] = 7  # an edit its own digest would have told
    assert header["format_version"] == 2
    (unlisted / "header.json").write_bytes(json.dumps(header, sort_keys=True).encode())
    expected = (
        f"Checkpoint {str(unlisted)!r}: its header.json carries no digest of its own "
        "(integrity.header), yet it says format_version 2, written with one (a record written "
        "before header digests says 1); it was edited since. Load another checkpoint."
    )
    assert {c.file: c.problem for c in verify(run)}["copied-out"] == expected
    with pytest.raises(CheckpointCorrupt) as exc:
        store.read_header(unlisted)
    assert str(exc.value) == expected
    header["format_version"] = 1  # a record directory written before header digests: read
    (unlisted / "header.json").write_bytes(json.dumps(header, sort_keys=True).encode())
    (check,) = verify(unlisted)
    assert (check.ok, check.problem) == (True, None)


@pytest.mark.parametrize(
    "odd", ["../shard-00002-model-00001-of-00001.safetensors", "/etc/passwd", "sub/x.safetensors"]
)
def test_a_header_json_listing_a_shard_outside_its_directory_is_refused_by_that_name(sharded, odd):
    from nitro_core.store import digest

    run, (_, second) = sharded
    unlisted = run / "copied-out"
    shutil.copytree(second, unlisted)
    header = json.loads((unlisted / "header.json").read_bytes())
    del header["integrity"]
    header["shards"][odd] = header["shards"].pop(_shard(unlisted, 2).name)
    (unlisted / "header.json").write_bytes(digest.sealed_json_header(header))  # its digest fits
    assert {c.file: c.problem for c in verify(run)}["copied-out"] == (
        f"Checkpoint {str(unlisted)!r}: its header.json lists the shard {odd!r}, which is not a "
        "shard file name (shard-NNNNN-model-NNNNN-of-NNNNN.safetensors, in the record directory "
        "itself); the header was edited, or not written by Nitro. Load another checkpoint."
    )


def test_a_header_json_that_is_a_fifo_is_refused_never_opened(sharded):
    run, (_, second) = sharded
    header = second / "header.json"
    header.unlink()
    os.mkfifo(header)
    # a writer, so that a reader's open of the FIFO returns (a regression fails, never hangs)
    writer = threading.Thread(target=lambda: os.close(os.open(header, os.O_WRONLY)), daemon=True)
    writer.start()
    try:
        checks = {c.file: c.problem for c in verify(run)}
    finally:
        release = os.open(header, os.O_RDONLY | os.O_NONBLOCK)  # held: the writer's open returns
        writer.join(timeout=60)
        os.close(release)
    assert checks[second.name] == (
        f"Checkpoint {str(second)!r}: its header.json is not a regular file (a FIFO or a "
        "device), not the file rank 0 wrote, so its shards cannot be checked. Load another "
        "checkpoint."
    )
    assert not writer.is_alive()


# -- directories holding run directories, and nothing found ------------------------------------
def test_a_directory_of_run_directories_is_verified_run_by_run(run, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    run.rename(runs / "a")
    Nitro(KeepLast(), run_dir=runs / "group" / "b").train().logger.close()
    (runs / ".nitro").mkdir()  # hidden: a job store, never entered
    files = [f"a/{e.file}" for e in read_manifest(runs / "a")]
    files += [f"group/b/{e.file}" for e in read_manifest(runs / "group" / "b")]
    assert [(c.file, c.listed, c.ok) for c in verify(runs)] == [(f, True, True) for f in files]


def test_nothing_to_verify_is_said_never_reported_as_all_fine(tmp_path, capsys):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "notes.txt").write_text("no records here")
    with pytest.raises(CheckpointMissing) as exc:
        verify(empty)
    assert str(exc.value) == (
        f"No records found under {str(empty)!r}: it holds no manifest.json and no record, nor "
        "does any directory below it. Give a run directory or a record, e.g. nitro verify "
        "runs/Classifier."
    )
    assert main(["verify", str(empty)]) == 1
    assert capsys.readouterr().err == f"nitro verify: {exc.value}\n"
    run = tmp_path / "run"
    Nitro(KeepLast(), run_dir=run).train().logger.close()
    delete_checkpoints(run, dry_run=False)  # a run directory whose manifest lists nothing
    with pytest.raises(CheckpointMissing) as exc:
        verify(run)
    assert str(exc.value) == (
        f"No records found under {str(run)!r}: its manifest lists none and it holds no "
        "record. Give a run directory or a record, e.g. nitro verify runs/Classifier."
    )


def test_the_nitro_verify_tool_checks_record_directories_and_says_when_nothing_is_there(
    tmp_path,
):
    import anyio
    from mcp import Client

    from nitro_mcp.server import build_server

    Nitro(KeepLast(), run_dir=tmp_path / "runs" / "x").train().logger.close()
    (first, _) = to_record_directories(tmp_path / "runs" / "x")
    _damage("flipped shard", first, tmp_path)
    (tmp_path / "nothing").mkdir()

    async def calls():
        async with Client(build_server(tmp_path)) as client:
            found = await client.call_tool("nitro_verify", {"path": "runs"})
            empty = await client.call_tool("nitro_verify", {"path": "nothing"})
            return found, empty

    found, empty = anyio.run(calls)
    reply = found.structured_content
    assert not found.is_error and (reply["checked"], reply["ok"]) == (2, False)
    assert [(p["file"], p["problem"]) for p in reply["problems"]] == [
        (f"x/{first.name}", _problem("flipped shard", first, listed=True))
    ]
    assert empty.is_error and empty.content[0].text == (
        "Error executing tool nitro_verify: "
        f"No records found under {str(tmp_path / 'nothing')!r}: it holds no manifest.json and "
        "no record, nor does any directory below it. Give a run directory or a record, e.g. "
        "nitro verify runs/Classifier."
    )


@pytest.mark.slow
def test_a_real_two_rank_fsdp_run_verifies_and_its_damage_is_named(tmp_path):
    from tests.nitro_core.distributed.conftest import torchrun

    torchrun(2, tmp_path, 2, "false", "fsdp")  # the script also dumps plain tensor files
    entries = read_manifest(tmp_path)
    listed = [(c.file, c.ok, c.sections) for c in verify(tmp_path) if c.listed]
    assert listed == [(e.file, True, ["optim", "params", "rng"]) for e in entries]
    record = tmp_path / entries[-1].file
    _damage("swapped shards", record, tmp_path)
    assert {c.file: c.problem for c in verify(tmp_path)}[record.name] == _problem(
        "swapped shards", record, listed=True
    )
