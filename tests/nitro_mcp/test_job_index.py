"""The job index: listing jobs reads ``.nitro/jobs-index.jsonl`` and only the live jobs'
own files, never every job's status; it follows the job directories (new, pruned), is
rebuilt when missing, ignores a torn line, and a link in its place is never followed."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import anyio
from mcp import Client

from nitro_core.jobs import JobManager, job_list, local, manager
from nitro_core.jobs.call_models import TrainCall
from nitro_core.jobs.files import JobSpec, JobStatus
from nitro_core.jobs.index import INDEX_NAME
from nitro_mcp.server import build_server

from .conftest import call


def ended_job(root: Path, i: int, state: str = "succeeded") -> str:
    """A finished job's directory, written as a worker leaves it."""
    job_id = f"20200101-{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}-{i:06x}"
    directory = root / ".nitro" / "jobs" / job_id
    directory.mkdir(parents=True)
    created = f"2020-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000Z"
    run_dir = str(root / "runs" / f"r{i}")
    call = TrainCall(experiment="Regression", run_dir=run_dir)
    spec = JobSpec(job_id=job_id, kind="train", call=call, created=created)
    status = JobStatus(
        job_id=job_id, kind="train", state=state, phase="done", run_dir=run_dir, epoch=i % 7,
        created=created, ended=created,
    )  # fmt: skip
    (directory / "spec.json").write_text(spec.model_dump_json())
    (directory / "status.json").write_text(status.model_dump_json())
    return job_id


class Reads:
    """Counts the status files the manager reads."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        real = manager.read_status

        def counted(directory):
            self.count += 1
            return real(directory)

        for module in (manager, job_list, local):  # every module the manager reads through
            monkeypatch.setattr(module, "read_status", counted)


def test_listing_reads_the_index_and_the_live_jobs_only(tmp_path, monkeypatch):
    ids = [ended_job(tmp_path, i, "failed" if i % 5 == 0 else "succeeded") for i in range(300)]
    jobs = JobManager(tmp_path, max_jobs=0)
    live = jobs.submit(TrainCall(experiment="Regression", run_dir=str(tmp_path / "runs/x")))
    first, more = jobs.page(None, 0, 20)  # builds the index (the one full read)
    assert more and [r.job_id for r in first] == [live.job_id, *ids[::-1][:19]]
    reads = Reads(monkeypatch)
    again = JobManager(tmp_path, max_jobs=0)  # a restarted server, or a worker's pump
    page, more = again.page(None, 20, 20)
    assert [r.job_id for r in page] == ids[::-1][19:39] and more
    assert (page[0].experiment, page[0].epoch) == ("Regression", (299 - 19) % 7)
    assert reads.count == 3  # the queued job only (the pump twice, the listing once): not 301
    assert [s.job_id for s in again.live()] == [live.job_id] and reads.count == 4
    failed, _ = again.page("failed", 0, 100)
    assert [r.job_id for r in failed] == [i for i in ids[::-1] if int(i[-6:], 16) % 5 == 0]
    assert [r.job_id for r in again.page("queued", 0, 5)[0]] == [live.job_id]


def test_the_index_follows_the_job_directories_and_is_rebuilt_when_missing(tmp_path):
    ids = [ended_job(tmp_path, i) for i in range(5)]
    jobs = JobManager(tmp_path, max_jobs=0)
    assert len(jobs.page(None, 0, 100)[0]) == 5
    index = tmp_path / ".nitro" / INDEX_NAME
    assert [json.loads(line)["job_id"] for line in index.read_text().splitlines()] == ids
    new = ended_job(tmp_path, 5)  # another server made it
    (tmp_path / ".nitro" / "jobs" / ids[0] / "status.json").unlink()  # being pruned
    (tmp_path / ".nitro" / "jobs" / ids[0] / "spec.json").unlink()
    (tmp_path / ".nitro" / "jobs" / ids[0]).rmdir()
    with index.open("a") as f:
        f.write('{"job_id": "torn", "kind": "tra')  # a write cut short
    listed = [r.job_id for r in jobs.page(None, 0, 100)[0]]
    assert listed == [new, *reversed(ids[1:])]  # the torn line is skipped
    index.unlink()
    assert [r.job_id for r in JobManager(tmp_path).page(None, 0, 100)[0]] == listed
    assert index.is_file()


def test_a_job_seen_ended_is_noted_once_and_listed_from_the_index(tmp_path, monkeypatch):
    jobs = JobManager(tmp_path, max_jobs=0)
    job = jobs.submit(TrainCall(experiment="Regression", run_dir=str(tmp_path / "runs/r")))
    assert jobs.stop(job.job_id).state == "stopped"
    (row,) = jobs.page(None, 0, 10)[0]
    assert row.state == "stopped"
    lines = (tmp_path / ".nitro" / INDEX_NAME).read_text().splitlines()
    assert [json.loads(x)["state"] for x in lines][-1] == "stopped"
    with (tmp_path / ".nitro" / INDEX_NAME).open("a") as f:  # a late writer's older line
        f.write(lines[0] + "\n")
    reads = Reads(monkeypatch)
    assert JobManager(tmp_path).page("stopped", 0, 10)[0][0].job_id == job.job_id
    assert reads.count == 0  # an end is final: never read again, whatever line follows it


def test_a_link_at_the_index_is_never_followed(tmp_path, caplog):
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours\n")
    root = tmp_path / "root"
    ids = [ended_job(root, i) for i in range(3)]
    (root / ".nitro" / INDEX_NAME).symlink_to(outside)

    async def main():
        async with Client(build_server(root, max_jobs=0)) as client:
            err, job = await call(client, "nitro_train", experiment="Regression")
            assert not err, job
            err, page = await call(client, "nitro_jobs")
            assert not err, page
            return [job["job_id"]] + [j["job_id"] for j in page["jobs"]]

    with caplog.at_level(logging.WARNING, logger="nitro_core.jobs.index"):
        new, *listed = anyio.run(main)
    assert listed == [new, *reversed(ids)]
    assert outside.read_text() == "not yours\n"
    assert (root / ".nitro" / INDEX_NAME).is_symlink()
    assert any("is a symbolic link; it is left alone" in m for m in caplog.messages)


def test_no_index_is_written_while_the_store_holds_no_job(tmp_path):
    (tmp_path / ".nitro" / "jobs").mkdir(parents=True)
    jobs = JobManager(tmp_path)
    assert jobs.page(None, 0, 20) == ([], False)
    jobs.pump()
    assert not (tmp_path / ".nitro" / INDEX_NAME).exists()
