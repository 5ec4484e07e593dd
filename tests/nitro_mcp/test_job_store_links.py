"""Links planted in the job store never lead a read or a write out of the root: ``.nitro``,
``.nitro/jobs`` and each job's directory must be real directories (a link is refused, or
skipped when listing), and every file of a job (``events.jsonl``, ``log.txt``,
``status.json``, the lock files) is opened without following a link. The outside target is
compared byte for byte before and after; nothing of it is echoed."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core.errors import UnsafePath
from nitro_core.jobs import JobManager
from nitro_core.jobs import local as local_module
from nitro_core.jobs.call_models import TrainCall
from nitro_core.jobs.files import append_event, job_dir, log_tail, read_spec, read_status
from nitro_core.jobs.status import update_status, update_status_if
from nitro_core.jobs.worker import _main, _Stop
from nitro_mcp.server import build_server

from .conftest import call

SECRET = b'{"job_id": "outside", "secret": "do not echo me"}\n'
RUN = {"experiment": "Regression"}


def store_refusal(path: Path) -> str:
    return (
        f"Refusing to use {str(path)!r}: it is a symbolic link, and Nitro keeps its job store "
        "only in real directories under the root (a link could lead outside it). Remove the "
        "link, or replace it by a real directory."
    )


def file_refusal(path: Path) -> str:
    return (
        f"Refusing to open {str(path)!r}: it is a symbolic link, and Nitro never follows a link "
        "for a file it keeps in its job store (it could lead outside it). Replace the link by "
        "the real file, or remove it."
    )


def fingerprint(directory: Path) -> dict[str, str]:
    """Every path under ``directory`` with the sha256 of its bytes (links as their target)."""
    out = {}
    for p in sorted(directory.rglob("*")):
        key = str(p.relative_to(directory))
        if p.is_symlink():
            out[key] = "-> " + str(p.readlink())
        elif p.is_file():
            out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[key] = "dir"
    return out


@pytest.fixture
def layout(tmp_path) -> tuple[Path, Path]:
    """A root, and beside it an outside directory shaped like a job store, with a secret."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    (outside / "jobs" / "j1").mkdir(parents=True)
    (outside / "jobs" / "j1" / "status.json").write_bytes(SECRET)
    (outside / "victim.txt").write_bytes(SECRET)
    return root, outside


def queued(root: Path) -> tuple[JobManager, str, Path]:
    jobs = JobManager(root, max_jobs=0)  # no slot: the job stays queued, nothing is launched
    job = jobs.submit(TrainCall(run_dir=str(root / "runs/r"), **RUN))
    return jobs, job.job_id, job_dir(root, job.job_id)


@pytest.mark.parametrize("where", [".nitro", ".nitro/jobs"])
def test_a_link_at_the_job_store_is_refused_and_nothing_outside_is_touched(layout, where):
    root, outside = layout
    link = root / where
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside if where == ".nitro" else outside / "jobs")
    before = fingerprint(outside)
    jobs = JobManager(root, max_jobs=0)
    for action in (lambda: jobs.submit(TrainCall(run_dir=str(root / "runs/r"), **RUN)), jobs.list):
        with pytest.raises(UnsafePath) as exc:
            action()
        assert str(exc.value) == store_refusal(link)
    assert fingerprint(outside) == before


def test_the_server_refuses_a_job_store_link_without_echoing_what_lies_behind_it(layout):
    root, outside = layout
    (root / ".nitro").symlink_to(outside)
    before = fingerprint(outside)

    async def main():
        async with Client(build_server(root, max_jobs=0)) as client:
            return [
                await call(client, "nitro_train", experiment="Regression"),
                await call(client, "nitro_jobs"),
                await call(client, "nitro_status", job_id="j1"),
            ]

    for tool, (err, text) in zip(("nitro_train", "nitro_jobs", "nitro_status"), anyio.run(main)):
        assert err and text == f"Error executing tool {tool}: " + store_refusal(root / ".nitro")
    assert fingerprint(outside) == before


def test_a_job_directory_link_is_skipped_when_listing_and_refused_by_name(layout, caplog):
    root, outside = layout
    jobs, job_id, _ = queued(root)
    (root / ".nitro" / "jobs" / "j1").symlink_to(outside / "jobs" / "j1")
    with caplog.at_level(logging.DEBUG, logger="nitro_core.jobs.job_list"):
        assert [s.job_id for s in jobs.list()] == [job_id]
    assert "skipping j1 in the job store: it is a symbolic link" in caplog.messages
    with pytest.raises(UnsafePath) as exc:
        jobs.status("j1")
    assert str(exc.value) == store_refusal(root / ".nitro" / "jobs" / "j1")


def test_a_status_file_link_is_never_read(layout):
    root, outside = layout
    jobs, job_id, directory = queued(root)
    (directory / "status.json").unlink()
    (directory / "status.json").symlink_to(outside / "jobs" / "j1" / "status.json")
    assert jobs.list() == []  # skipped, not read
    for action in (lambda: read_status(directory), lambda: jobs.status(job_id)):
        with pytest.raises(UnsafePath) as exc:
            action()
        assert str(exc.value) == file_refusal(directory / "status.json")


@pytest.mark.parametrize("dangling", [False, True])
def test_an_events_link_is_never_appended_through(layout, caplog, dangling):
    root, outside = layout
    jobs, job_id, directory = queued(root)
    target = outside / ("new.txt" if dangling else "victim.txt")  # O_CREAT would create it
    (directory / "events.jsonl").unlink()
    (directory / "events.jsonl").symlink_to(target)
    before = fingerprint(outside)
    with pytest.raises(UnsafePath) as exc:
        append_event(directory, {"event": "x"})
    assert str(exc.value) == file_refusal(directory / "events.jsonl")
    with caplog.at_level(logging.WARNING, logger="nitro_core.jobs.files"):
        assert jobs.stop(job_id).state == "stopped"  # status.json holds the stop all the same
    assert caplog.messages == [
        f"the stopped event of job {job_id} is not recorded: "
        + file_refusal(directory / "events.jsonl")
    ]
    assert fingerprint(outside) == before


def test_a_worker_whose_events_file_is_a_link_fails_with_the_refusal(layout):
    root, outside = layout
    jobs, job_id, directory = queued(root)
    (directory / "events.jsonl").unlink()
    (directory / "events.jsonl").symlink_to(outside / "victim.txt")
    before = fingerprint(outside)
    update_status_if(directory, {"queued"}, state="running", phase="launching")  # as launched
    assert _main(read_spec(directory), directory, _Stop(directory)) == 1
    status = read_status(directory)
    assert (status.state, status.error) == ("failed", file_refusal(directory / "events.jsonl"))
    assert fingerprint(outside) == before


@pytest.mark.parametrize("dangling", [False, True])
def test_a_log_link_fails_the_job_at_launch_and_is_never_read(layout, monkeypatch, dangling):
    root, outside = layout
    jobs, job_id, directory = queued(root)
    (directory / "log.txt").symlink_to(outside / ("new.txt" if dangling else "victim.txt"))
    before = fingerprint(outside)

    def no_worker(*args, **kwargs):
        raise AssertionError("a worker was started with its log through a link")

    monkeypatch.setattr(local_module.subprocess, "Popen", no_worker)
    jobs.max_jobs = 1
    jobs.pump()
    status = read_status(directory)
    assert (status.state, status.error, status.hint) == (
        "failed",
        file_refusal(directory / "log.txt"),
        "Remove the link, then submit the job again.",
    )
    with pytest.raises(UnsafePath) as exc:
        log_tail(directory)
    assert str(exc.value) == file_refusal(directory / "log.txt")
    assert fingerprint(outside) == before


@pytest.mark.parametrize("dangling", [False, True])
@pytest.mark.parametrize("name", [".status.lock", "pump.lock"])
def test_a_lock_file_link_is_refused_and_the_target_untouched(layout, name, dangling):
    root, outside = layout
    jobs, job_id, directory = queued(root)
    home = directory if name == ".status.lock" else root / ".nitro"
    (home / name).unlink(missing_ok=True)
    (home / name).symlink_to(outside / ("new.txt" if dangling else "victim.txt"))
    before = fingerprint(outside)
    jobs.max_jobs = 1  # so that pump takes its lock
    action = (lambda: update_status(directory, epoch=1)) if name == ".status.lock" else jobs.pump
    with pytest.raises(UnsafePath) as exc:
        action()
    assert str(exc.value) == file_refusal(home / name)
    assert fingerprint(outside) == before
    assert read_status(directory).state == "queued"


def test_a_fifo_in_place_of_a_job_file_never_hangs_a_read(tmp_path):
    jobs, job_id, directory = queued(tmp_path)
    for name in ("status.json", "log.txt"):
        (directory / name).unlink(missing_ok=True)
        os.mkfifo(directory / name)
    seen: list[object] = []
    reader = threading.Thread(
        target=lambda: seen.extend([jobs.list(), log_tail(directory)]), daemon=True
    )
    reader.start()
    reader.join(10)
    assert seen == [[], ""]  # skipped, and no log to show; a blocking open would hang here
