"""Stopping a seed group and what an ended group's reply says next (nitro_mcp.seed_groups),
in-process over a group file and a stand-in for the gate's job manager (no worker, no
server): only the group's own live jobs are stopped, queued ones first, and the seeds that
did not succeed are the ones named."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nitro_core import ConfigError
from nitro_core.jobs.files import JobStatus
from nitro_core.jobs.groups import Group, write_group
from nitro_mcp import seed_groups

GROUP = "group-20261207-120000-abc123"
JOBS = ["20261207-120000-000001", "20261207-120000-000002", "20261207-120000-000003"]


class Jobs:
    """The gate's job manager as seed_groups uses it: statuses, specs and stops."""

    def __init__(self, store_dir, states, groups):
        self.store_dir = store_dir
        self.states = dict(zip(JOBS, states, strict=True))
        self.groups = dict(zip(JOBS, groups, strict=True))
        self.stopped: list[tuple[str, bool]] = []

    def status(self, job_id):
        return JobStatus(job_id=job_id, kind="train", state=self.states[job_id],
                         run_dir=f"/r/runs/e/seed-{JOBS.index(job_id)}", created="t",
                         result={"stop_reason": "budget"} if job_id == JOBS[0] else None)  # fmt: skip

    def spec(self, job_id):
        return SimpleNamespace(group=self.groups[job_id])

    def stop(self, job_id, force):
        self.stopped.append((job_id, force))
        self.states[job_id] = "stopped"


def _gate(tmp_path, states, groups=(GROUP, GROUP, GROUP)):
    store = tmp_path / ".nitro"
    write_group(store, Group(group=GROUP, experiment="e", run_dir="/r/runs/e", seeds=[0, 1, 2],
                             jobs=JOBS, run_dirs=[f"/r/runs/e/seed-{i}" for i in range(3)],
                             created="t"))  # fmt: skip
    return SimpleNamespace(jobs=Jobs(store, states, groups), root=tmp_path)


def test_a_group_stop_stops_its_queued_jobs_before_its_running_ones(tmp_path):
    gate = _gate(tmp_path, ["running", "queued", "succeeded"])
    said = seed_groups.stop(gate, GROUP, force=False)
    assert gate.jobs.stopped == [(JOBS[1], False), (JOBS[0], False)]
    assert said.next.startswith(
        f"Asked to stop at their next checkpoint: {JOBS[0]}, {JOBS[1]}. Each seed's run "
    )


def test_a_group_stop_leaves_a_job_whose_own_spec_names_another_group(tmp_path):
    other = "group-20261207-120000-ffffff"
    gate = _gate(tmp_path, ["running", "running", "queued"], groups=(GROUP, other, None))
    said = seed_groups.stop(gate, GROUP, force=True)
    assert gate.jobs.stopped == [(JOBS[0], True)]
    assert said.next.startswith(f"Killed: {JOBS[0]}. Each seed's run continues")
    gate = _gate(tmp_path, ["succeeded", "running", "queued"], groups=(GROUP, other, None))
    with pytest.raises(ConfigError, match=f"Group {GROUP} already ended; there is nothing to stop"):
        seed_groups.stop(gate, GROUP, force=True)
    assert gate.jobs.stopped == []


def test_an_ended_group_names_the_seeds_that_did_not_succeed(tmp_path):
    group = seed_groups.read(_gate(tmp_path, ["stopped"] * 3), GROUP)
    jobs = Jobs(None, ["stopped", "succeeded", "failed"], [GROUP] * 3)  # the first at its budget
    said = seed_groups._next(group, [jobs.status(j) for j in JOBS])
    assert said.startswith(
        f"1 of 3 seeds did not succeed: {JOBS[2]} (failed); nitro_status(job_id=...) of each "
        f"says why. nitro_compare(group='{GROUP}') gives each metric's mean"
    ), said
    assert said.endswith(" (the others only)")
    jobs = Jobs(None, ["stopped", "succeeded", "succeeded"], [GROUP] * 3)
    assert seed_groups._next(group, [jobs.status(j) for j in JOBS]).startswith(
        f"Done. nitro_compare(group='{GROUP}')"
    )
