"""Deleting checkpoints: the pure plan, the store carrying it out under the manifest lock, and
``delete_checkpoints``: a dry run changes nothing, another run's files and entries are never
touched, a run being trained is refused. Also: a ``weights=`` branch records its parent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nitro_core import (
    CheckpointNotFound,
    ConfigError,
    Nitro,
    TrainingRefused,
    delete_checkpoints,
    read_manifest,
)
from nitro_core.policy.deletion_plan import plan_deletion
from nitro_core.store import manifest
from nitro_core.store import recordio as store
from nitro_core.store.manifest import ManifestEntry, Point

from .sharded_runs import to_record_directories
from .tiny import KeepLast, Tiny

SHA = "0" * 64


def entry(file: str, run: str, epoch: int, size: int = 10) -> ManifestEntry:
    return ManifestEntry(
        file=file, epoch=epoch, step=epoch * 4, score=1.0 / epoch, metric="loss", mode="min",
        stop_reason=None, run=run, written="2026-01-01T00:00:00.000Z", bytes=size, sha256=SHA,
    )  # fmt: skip


ENTRIES = [entry("a1.safetensors", "a", 1), entry("b1.safetensors", "b", 1, 20),
           entry("a2.safetensors", "a", 2), entry("b2.safetensors", "b", 2, 20)]  # fmt: skip
POINTS = {"a": [Point(epoch=e, step=4 * e) for e in (1, 2, 3)], "b": [Point(epoch=1, step=4)]}


# -- the plan: pure ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "run, files, entries, runs, points",
    [
        ("a", None, ["a1.safetensors", "a2.safetensors"], ("a",), 3),
        (None, ["b2.safetensors", "a1.safetensors"], ["a1.safetensors", "b2.safetensors"], (), 0),
        ("b", ["b1.safetensors"], ["b1.safetensors"], (), 0),
        (None, None, [e.file for e in ENTRIES], ("a", "b"), 4),
    ],
)  # fmt: skip
def test_a_plan_takes_only_what_was_named(run, files, entries, runs, points):
    plan = plan_deletion(ENTRIES, POINTS, run, files, "runs/x")
    assert list(plan.files) == entries and plan.runs == runs and plan.points == points
    assert plan.bytes == sum(e.bytes for e in ENTRIES if e.file in entries)


@pytest.mark.parametrize(
    "run, files, error, message",
    [
        ("zz", None, CheckpointNotFound,
         "run='zz' is not a run of 'runs/x'; it holds runs a, b. Write one of those run ids."),
        ("a", ["b1.safetensors"], ConfigError,
         "files: 'b1.safetensors' belongs to run b, not to run='a', and a deletion never touches "
         "another run's files. Drop it from files, or leave run out."),
        (None, ["../manifest.json"], CheckpointNotFound,
         "files: '../manifest.json' is not listed in 'runs/x''s manifest, and Nitro deletes only "
         "records a manifest lists; it lists files a1.safetensors, b1.safetensors, a2.safetensors, "
         "b2.safetensors."),
        (None, [], ConfigError,
         "files=[] names nothing to delete; give record file names as the manifest lists them, "
         "e.g. files=['epoch-0003-step-24-loss=0.5.safetensors'], or leave files out to delete a "
         "whole run (run='<run id>')."),
    ],
)  # fmt: skip
def test_a_plan_refuses_what_is_not_there(run, files, error, message):
    with pytest.raises(error) as info:
        plan_deletion(ENTRIES, POINTS, run, files, "runs/x")
    assert str(info.value) == message


def test_a_plan_for_an_empty_manifest_says_there_is_nothing():
    with pytest.raises(CheckpointNotFound) as info:
        plan_deletion([], {}, None, None, "runs/x")
    assert str(info.value) == (
        "Nothing to delete in 'runs/x': its manifest lists no checkpoints and no runs."
    )


# -- carrying it out on disk -------------------------------------------------------------------
def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file, link and directory below ``directory``, byte for byte (links not followed)."""
    out: dict[str, bytes] = {}
    for base, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(base) / name
            key = str(path.relative_to(directory))
            if path.is_symlink():
                out[key] = b"-> " + os.readlink(path).encode()
            elif path.is_dir():
                out[key] = b"<dir>"
            else:
                out[key] = path.read_bytes()
    return out


@pytest.fixture
def two_runs(tmp_path):
    """runs/x holding runs a and b (3 epochs each, every epoch kept), and runs/y with one run."""
    d = tmp_path / "runs" / "x"
    a = Nitro(Tiny(), run_dir=d, seed=1).train().run_id
    b = Nitro(Tiny(), run_dir=d, seed=2).train().run_id
    other = Nitro(Tiny(), run_dir=tmp_path / "runs" / "y").train().run_id
    return d, a, b, other


def test_a_dry_run_shows_what_would_go_and_changes_nothing(two_runs, tmp_path):
    d, a, b, _ = two_runs
    before = snapshot(tmp_path)
    done = delete_checkpoints(d, run=a)
    assert snapshot(tmp_path) == before
    mine = [e for e in read_manifest(d) if e.run == a]
    assert done.dry_run and done.runs == (a,) and done.entries == tuple(mine)
    assert [(f.path, f.run) for f in done.files] == [(e.file, a) for e in mine] + [
        (f"logs/{a}.jsonl", a)
    ]
    assert done.bytes == sum(len(before[f"runs/x/{f.path}"]) for f in done.files)
    assert done.points == 3 and done.missing == () and done.skipped == ()


def test_deleting_a_run_removes_its_records_points_and_log_and_nothing_else(two_runs, tmp_path):
    d, a, b, _ = two_runs
    for run in (a, b):  # TensorBoard event files, where TensorBoardLogger writes them
        (d / "logs" / "tb" / run).mkdir(parents=True)
        (d / "logs" / "tb" / run / "events.out.tfevents.1").write_bytes(
            b"events of " + run.encode()
        )
    before = snapshot(tmp_path)
    kept = manifest.load(d)
    done = delete_checkpoints(d, run=a, dry_run=False)
    after = snapshot(tmp_path)
    gone = {f"runs/x/{f.path}" for f in done.files}
    assert f"runs/x/logs/tb/{a}/events.out.tfevents.1" in gone
    assert gone and not gone & set(after) and f"runs/x/logs/tb/{a}" not in after
    gone.add(f"runs/x/logs/tb/{a}")
    changed = {k for k in before if k not in gone and before[k] != after.get(k)}
    assert changed == {"runs/x/manifest.json"}  # every other byte is as it was
    now = manifest.load(d)
    assert now.entries == [e for e in kept.entries if e.run == b]
    assert now.points == {b: kept.points[b]}


def test_deleting_files_keeps_the_runs_points_and_log(two_runs, tmp_path):
    d, a, b, _ = two_runs
    first = [e for e in read_manifest(d) if e.run == a][0]
    kept = manifest.load(d)
    before = snapshot(tmp_path)
    done = delete_checkpoints(d, run=a, files=[first.file], dry_run=False)
    assert [f.path for f in done.files] == [first.file] and done.runs == () and done.points == 0
    after = snapshot(tmp_path)
    assert {k for k in before if before[k] != after.get(k)} == {
        "runs/x/manifest.json",
        f"runs/x/{first.file}",
    }
    assert manifest.load(d).entries == [e for e in kept.entries if e.file != first.file]
    assert manifest.load(d).points == kept.points


def test_a_run_being_trained_is_refused_and_nothing_changes(two_runs, tmp_path):
    d, a, _, _ = two_runs
    before = snapshot(tmp_path)
    with store.run_lock(d, a) as mine:  # what a training process holds for the run
        assert mine
        for dry_run in (True, False):
            with pytest.raises(TrainingRefused) as info:
                delete_checkpoints(d, run=a, dry_run=dry_run)
            assert str(info.value) == (
                f"Cannot delete from run {a} in {str(d)!r}: a process is training it right now, "
                "and it would write on after the deletion. Stop that training first (or wait "
                "for it to end), then delete again; nothing was deleted."
            )
    assert snapshot(tmp_path) == before


def test_links_in_a_run_directory_are_never_followed(two_runs, tmp_path):
    d, a, _, _ = two_runs
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.safetensors").write_bytes(b"keep me")
    (outside / f"{a}.jsonl").write_bytes(b"keep me too")
    record = [e for e in read_manifest(d) if e.run == a][0].file
    (d / record).unlink()
    (d / record).symlink_to(outside / "precious.safetensors")
    os.rename(d / "logs", tmp_path / "real_logs")
    (d / "logs").symlink_to(outside)
    done = delete_checkpoints(d, run=a, dry_run=False)
    assert done.skipped == () and f"logs/{a}.jsonl" not in [f.path for f in done.files]
    assert [f.bytes for f in done.files if f.path == record] == [0]  # the link, not its target
    assert (outside / "precious.safetensors").read_bytes() == b"keep me"
    assert (outside / f"{a}.jsonl").read_bytes() == b"keep me too"
    assert not os.path.lexists(d / record) and not [e for e in read_manifest(d) if e.run == a]


def test_a_directory_that_does_not_exist_is_refused_without_creating_it(tmp_path):
    with pytest.raises(CheckpointNotFound) as info:
        delete_checkpoints(tmp_path / "nope", dry_run=False)
    assert str(info.value) == (
        f"Nothing to delete: {str(tmp_path / 'nope')!r} is not a directory. Give a run "
        "directory, one that holds a manifest.json."
    )
    assert not (tmp_path / "nope").exists()


# -- record directories (an FSDP run's): one deleter for files and directories ---------------
def _tree_bytes(directory: Path) -> int:
    return sum(
        p.lstat().st_size for p in directory.rglob("*") if p.is_file() and not p.is_symlink()
    )


def test_deleting_record_directories_frees_every_file_in_them(tmp_path):
    d = tmp_path / "run"
    run = Nitro(KeepLast(), run_dir=d).train().run_id
    dirs = to_record_directories(d)
    sizes = {p.name: _tree_bytes(p) for p in dirs}
    dry = delete_checkpoints(d, run=run)
    records = {f.path: f.bytes for f in dry.files if not f.path.startswith("logs/")}
    assert records == sizes and all(p.is_dir() for p in dirs)  # a dry run counts, keeps
    done = delete_checkpoints(d, run=run, dry_run=False)
    assert [(f.path, f.bytes) for f in done.files] == [(f.path, f.bytes) for f in dry.files]
    assert done.bytes == dry.bytes >= sum(sizes.values()) > 0
    assert not any(os.path.lexists(p) for p in dirs) and read_manifest(d) == []


def test_links_at_or_inside_a_record_directory_are_never_followed(tmp_path):
    d = tmp_path / "run"
    run = Nitro(KeepLast(), run_dir=d).train().run_id
    first, second = to_record_directories(d)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.safetensors").write_bytes(b"keep me")
    shard = next(first.glob("shard-*.safetensors"))
    shard.unlink()
    shard.symlink_to(outside / "precious.safetensors")  # a link inside a record directory
    kept = _tree_bytes(first)
    os.rename(second, outside / "record")
    second.symlink_to(outside / "record")  # a record directory that is a link
    before = snapshot(outside)
    done = delete_checkpoints(d, files=[first.name, second.name], dry_run=False)
    assert [(f.path, f.bytes) for f in done.files] == [(first.name, kept), (second.name, 0)]
    assert snapshot(outside) == before  # neither link was followed
    assert not os.path.lexists(first) and not os.path.lexists(second)
    assert read_manifest(d) == [] and manifest.load(d).points[run]


def test_retention_evicts_record_directories_through_the_one_deleter(tmp_path):
    d = tmp_path / "run"
    Nitro(KeepLast(), run_dir=d).train().logger.close()
    dirs = to_record_directories(d)
    Nitro(KeepLast(max_epochs=5), run_dir=d, resume="auto").train().logger.close()
    assert [e.epoch for e in read_manifest(d)] == [4, 5]  # Last(2): both directories evicted
    assert not any(os.path.lexists(p) for p in dirs)


def test_nitro_delete_reports_the_bytes_of_record_directories(tmp_path):
    import anyio
    from mcp import Client

    from nitro_mcp.server import build_server

    d = tmp_path / "runs" / "x"
    run = Nitro(KeepLast(), run_dir=d).train().run_id
    dirs = to_record_directories(d)
    size = sum(_tree_bytes(p) for p in dirs)

    async def delete():
        async with Client(build_server(tmp_path)) as client:
            args = {"run_dir": "runs/x", "files": [p.name for p in dirs], "dry_run": False}
            return await client.call_tool("nitro_delete", args)

    result = anyio.run(delete)
    reply = result.structured_content
    assert not result.is_error and (reply["files_total"], reply["bytes"]) == (2, size)
    assert reply["next"].startswith(f"Deleted 2 files ({size / 1000:.1f} kB) and 2 manifest")
    assert not any(os.path.lexists(p) for p in dirs) and manifest.load(d).points[run]


# -- provenance: a weights branch names its parent ---------------------------------------------
def test_a_weights_branch_records_the_record_it_started_from(tmp_path):
    d = tmp_path / "runs" / "x"
    first = Nitro(Tiny(), run_dir=d).train()
    best = min(read_manifest(d), key=lambda e: e.score)
    branch = Nitro(Tiny(), run_dir=d, weights=f"{first.run_id} => best").train()
    averaged = Nitro(Tiny(), run_dir=d, weights=f"{first.run_id} => Average(Last(2))").train()
    parents = {e.run: e.parent for e in read_manifest(d)}
    assert parents == {
        first.run_id: None,
        branch.run_id: f"{first.run_id}/{best.file}",
        averaged.run_id: f"{first.run_id} => Average(Last(2))",
    }
