"""Seed groups through the real MCP client: ``nitro_train(seeds=[...])`` starts one real
worker per seed as one group, ``nitro_status`` and ``nitro_jobs`` follow it as one item, and
``nitro_compare(group=..., baseline=...)`` gives each metric's mean, standard deviation and
n as the records' own metrics give them, refusing groups scored differently."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import anyio
import pytest
from mcp import Client

from nitro_core import Nitro
from nitro_core.examples import Regression
from nitro_core.jobs.call_models import TrainCall
from nitro_core.jobs.files import JobSpec, JobStatus, job_dir, write_json
from nitro_core.jobs.groups import Group, write_group
from nitro_core.store import manifest
from nitro_core.store.manifest import now_iso
from nitro_core.store.recordio import read_header
from nitro_mcp.cli import main as main_cli
from nitro_mcp.replies import REPLY_MAX
from nitro_mcp.server import build_server
from tests.nitro_mcp.conftest import call

TRAIN = {"experiment": "Regression", "overrides": {"max_epochs": 2, "samples": 64, "batch_size": 8}}


def _record_metrics(run_dir) -> dict[str, float]:
    """The metrics of the run's last record, read from the record itself."""
    entries = manifest.read_manifest(run_dir)
    return read_header(run_dir / entries[-1].file)["metrics"]


async def _until_ended(client: Client, group_id: str) -> dict:
    with anyio.fail_after(600):  # a hang guard: the loop ends on the group's state
        while True:
            err, status = await call(
                client, "nitro_status", job_id=group_id, wait_s=10, until="end"
            )
            assert not err, status
            if status["state"] not in ("queued", "running"):
                return status


def test_a_group_of_three_seeds_is_followed_as_one_and_compared_by_its_records(tmp_path, capsys):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            err, started = await call(client, "nitro_train", **TRAIN, seeds=[0, 1, 2])
            assert not err, started
            group_id = started["job_id"]
            early = await call(client, "nitro_compare", group=group_id)  # its workers start
            ended = await _until_ended(client, group_id)
            err, jobs = await call(client, "nitro_jobs")
            assert not err, jobs
            err, spread = await call(client, "nitro_compare", group=group_id)
            assert not err, spread
            err, itself = await call(client, "nitro_compare", group=group_id, baseline=group_id)
            assert not err, itself
            err, one = await call(client, "nitro_compare", group=group_id,
                                  baseline="runs/Regression/seed-1")  # fmt: skip
            assert not err, one
            # a run trained under another budget, in this process
            Nitro(
                Regression(max_epochs=1, samples=64, batch_size=8),
                run_dir=tmp_path / "runs" / "short",
            ).train()
            shorter = await call(client, "nitro_compare", group=group_id, baseline="runs/short")
            for seed in (0, 1):  # a baseline of two runs that learn slowly, same budget
                weak = Regression(max_epochs=2, samples=64, batch_size=8, lr=1e-4)
                Nitro(weak, run_dir=tmp_path / "runs" / "weak", seed=seed).train()
            err, against = await call(
                client, "nitro_compare", group=group_id, baseline="runs/weak:all"
            )
            assert not err, against
            return started, early, ended, jobs, spread, itself, one, shorter, against

    started, early, ended, jobs, spread, itself, one, shorter, against = anyio.run(main)
    group_id = started["job_id"]
    assert group_id.startswith("group-")
    assert started["group"]["n"] == 3 and started["group"]["group"] == group_id
    assert [j["seed"] for j in started["group"]["jobs"]] == [0, 1, 2]
    assert [j["run_dir"] for j in started["group"]["jobs"]] == [
        f"runs/Regression/seed-{s}" for s in (0, 1, 2)
    ]
    assert f"nitro_compare(group='{group_id}')" in started["next"]
    assert early[0] and "jobs still queued or running" in early[1], early
    assert f"nitro_status(job_id='{group_id}', wait_s=25, until='end', brief=true)" in early[1]

    assert ended["state"] == "succeeded", ended
    assert ended["group"]["counts"] == {"succeeded": 3}
    assert ended["next"].startswith(f"Done. nitro_compare(group='{group_id}')")
    member_ids = {j["job_id"] for j in ended["group"]["jobs"]}
    assert len(member_ids) == 3
    listed = [j["job_id"] for j in jobs["jobs"]]
    assert listed == [group_id], listed  # the group as one item, its jobs not apart
    assert jobs["jobs"][0]["counts"] == {"succeeded": 3}

    recorded = [_record_metrics(tmp_path / "runs" / "Regression" / f"seed-{s}") for s in (0, 1, 2)]
    assert len({r["loss"] for r in recorded}) == 3  # three seeds, three results
    by_name = {m["metric"]: m for m in spread["spread"]["metrics"]}
    assert set(by_name) == set(recorded[0])
    for name, m in by_name.items():
        values = [r[name] for r in recorded]
        assert m["n"] == 3
        assert m["mean"] == pytest.approx(statistics.fmean(values), rel=1e-12)
        assert m["std"] == pytest.approx(statistics.stdev(values), rel=1e-12)
        assert m["baseline_mean"] is None and m["within_noise"] is None
    assert len(spread["spread"]["runs"]) == 3 and spread["spread"]["left_out"] == []

    for m in itself["spread"]["metrics"]:  # a baseline compared with itself
        assert m["difference"] == 0 and m["sigmas"] == 0 and m["within_noise"] is True
    assert "every metric is within noise" in itself["spread"]["note"]

    (loss,) = [m for m in one["spread"]["metrics"] if m["metric"] == "loss"]
    assert loss["baseline_n"] == 1 and loss["baseline_mean"] == recorded[1]["loss"]
    assert loss["sigmas"] is None and loss["within_noise"] is None
    assert "The baseline is one run, so it has no spread" in one["spread"]["note"]

    weak_dir = tmp_path / "runs" / "weak"
    entries = manifest.read_manifest(weak_dir)
    last = {e.run: e for e in entries}  # each run's last record
    weak = [read_header(weak_dir / e.file)["metrics"]["loss"] for e in last.values()]
    (loss,) = against["spread"]["metrics"]
    assert loss["baseline_n"] == 2
    assert loss["baseline_mean"] == pytest.approx(statistics.fmean(weak), rel=1e-12)
    assert loss["baseline_std"] == pytest.approx(statistics.stdev(weak), rel=1e-12)
    assert loss["sigmas"] == pytest.approx(loss["difference"] / loss["baseline_std"])
    assert loss["within_noise"] is False and loss["difference"] < 0  # lower loss: better
    assert against["spread"]["note"].endswith(
        "Against runs/weak:all: beyond noise (|sigmas| >= 2): loss (better, ranked min)."
    )
    assert (
        against["config_diff"]["lr"][:3] == [0.01] * 3
        and against["config_diff"]["lr"][3:] == [1e-4] * 2
    )

    capsys.readouterr()
    assert main_cli(["compare", "--group", group_id, "--baseline", "runs/weak:all",
                     "--root", str(tmp_path)]) == 0  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["metric", "mean", "std", "n", "baseline", "mean", "baseline", "std",
                              "baseline", "n", "sigmas", "within", "noise"]  # fmt: skip
    assert out[-1] == against["spread"]["note"]
    assert main_cli(["compare", "--baseline", "runs/weak"]) == 2
    assert "nitro compare: --group compares a seed group" in capsys.readouterr().err

    assert shorter[0], shorter
    assert shorter[1] == (
        f"Error executing tool nitro_compare: group='{group_id}' and baseline='runs/short' were "
        "scored under different budgets (max_epochs=2 vs max_epochs=1), so their spreads do not "
        "compare. Compare against a baseline trained under the same budgets, e.g. a group "
        "started with the same call but for the change you test."
    )


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        ({"seeds": [3]}, "seeds names 1 seed; a group runs 2 to 16 (e.g. seeds=[0, 1, 2]). For "
         "one run send seed= instead."),
        ({"seeds": [0, 1, 0]}, "seeds repeats 0; each seed of a group trains once, so send each "
         "once, e.g. seeds=[0, 1, 2]."),
        ({"seeds": [0, 1], "seed": 4}, "seed=4 and seeds=[0, 1] both name seeds; send "
         "seeds=[...] for a group (one run per seed) or seed= for one run, not both."),
        ({"seeds": [0, -1]}, "seed=-1"),
    ],
)  # fmt: skip
def test_a_bad_group_is_refused_and_starts_nothing(tmp_path, extra, text):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            return await call(client, "nitro_train", **TRAIN, **extra)

    err, reply = anyio.run(main)
    assert err and text in reply, reply
    assert not (tmp_path / ".nitro" / "jobs").exists() or not any(
        (tmp_path / ".nitro" / "jobs").iterdir()
    )


def test_compare_refuses_a_group_it_cannot_read_and_says_what_to_send(tmp_path):
    async def main():
        async with Client(build_server(tmp_path)) as client:
            return [
                await call(client, "nitro_compare", group="group-20260101-000000-abcdef"),
                await call(client, "nitro_compare", group="runs/a"),
                await call(client, "nitro_compare", baseline="runs/a"),
                await call(client, "nitro_compare"),
                await call(client, "nitro_compare", sources=["runs/a"], group="g"),
                await call(client, "nitro_status", job_id="group-20260101-000000-abcdef"),
            ]

    missing, not_id, alone, empty, both, status = anyio.run(main)
    prefix = "Error executing tool nitro_compare: "
    assert missing[1].startswith(prefix + "No group 'group-20260101-000000-abcdef' under ")
    assert "nitro_jobs lists groups and jobs" in missing[1]
    assert not_id[1] == prefix + (
        "group='runs/a' is not a group id; nitro_train(seeds=[0, 1, 2]) starts a group and "
        "returns its id, e.g. nitro_compare(group='group-20261206-211900-a1b2c3', "
        "baseline='runs/Classifier')."
    )
    assert alone[1].startswith(prefix + "baseline='runs/a' is what a group is compared against")
    assert empty[1].startswith(prefix + "nitro_compare needs sources=[...]")
    assert both[1].startswith(prefix + "sources and group='g' both name what to compare")
    assert status[0] and "No group 'group-20260101-000000-abcdef'" in status[1]


def test_a_group_retried_by_request_id_is_one_group_and_stops_as_one(tmp_path):
    long = {"experiment": "Regression", "overrides": {"max_epochs": 10_000, "samples": 64}}

    async def main():
        async with Client(build_server(tmp_path)) as client:
            err, started = await call(
                client, "nitro_train", **long, seeds=[5, 6, 7], request_id="g1"
            )
            assert not err, started
            group_id = started["job_id"]
            err, retried = await call(
                client, "nitro_train", **long, seeds=[5, 6, 7], request_id="g1"
            )
            assert not err, retried
            assert retried["job_id"] == group_id and retried["duplicate"] is True
            assert retried["next"].startswith(
                "An earlier call with request_id='g1' started this group"
            )
            assert len(list((tmp_path / ".nitro" / "jobs").iterdir())) == 3  # no second group
            err, stopped = await call(client, "nitro_stop", job_id=group_id, force=True)
            assert not err, stopped
            ended = await _until_ended(client, group_id)
            again = await call(client, "nitro_stop", job_id=group_id)
            first_job = tmp_path / ".nitro" / "jobs" / started["group"]["jobs"][0]["job_id"]
            shutil.rmtree(first_job)  # seed 5's job pruned: the id still names the group
            err, later = await call(client, "nitro_train", **long, seeds=[5, 6, 7], request_id="g1")
            assert not err, later
            return started, stopped, ended, again, later

    started, stopped, ended, again, later = anyio.run(main)
    group_id = started["job_id"]
    members = [j["job_id"] for j in started["group"]["jobs"]]
    assert stopped["job_id"] == group_id and stopped["phase"] is None
    assert stopped["next"].startswith("Killed: ") and all(m in stopped["next"] for m in members)
    assert (
        "Each seed's run continues with nitro_train(..., run_dir=<its directory>, seed=<its "
        "seed>, resume='auto') (" in stopped["next"]
    )
    assert "seed 7: run_dir='runs/Regression/seed-7'" in stopped["next"]
    assert ended["state"] == "stopped" and ended["group"]["counts"] == {"stopped": 3}, ended
    # seeds 5 and 6 ran (two slots), 7 waited: stopped first, it never started
    queued = json.loads((tmp_path / ".nitro" / "jobs" / members[2] / "status.json").read_text())
    assert queued["started"] is None and queued["state"] == "stopped", queued
    assert later["job_id"] == group_id and later["duplicate"] is True
    assert [j["state"] for j in later["group"]["jobs"]] == ["lost", "stopped", "stopped"]
    assert again == (True, f"Error executing tool nitro_stop: Group {group_id} already ended; "
                     f"there is nothing to stop. nitro_status(job_id='{group_id}') shows how each "
                     "seed ended.")  # fmt: skip


def test_a_group_stopped_by_its_budget_compares_and_refuses_an_unbudgeted_baseline(tmp_path):
    budgeted = {**TRAIN, "max_steps": 6}  # 6 steps an epoch: each seed stops after epoch 1

    async def main():
        async with Client(build_server(tmp_path)) as client:
            err, started = await call(client, "nitro_train", **budgeted, seeds=[0, 1])
            assert not err, started
            group_id = started["job_id"]
            ended = await _until_ended(client, group_id)
            err, done = await call(client, "nitro_jobs", state="succeeded")
            assert not err and [j["job_id"] for j in done["jobs"]] == [group_id], done
            err, itself = await call(client, "nitro_compare", group=group_id, baseline=group_id)
            assert not err, itself
            Nitro(
                Regression(max_epochs=2, samples=64, batch_size=8), run_dir=tmp_path / "free"
            ).train()
            unbudgeted = await call(client, "nitro_compare", group=group_id, baseline="free")
            return group_id, ended, itself, unbudgeted

    group_id, ended, itself, unbudgeted = anyio.run(main)
    # each job ended stopped, at its budget: the group trained to its end
    assert ended["state"] == "succeeded" and ended["group"]["counts"] == {"stopped": 2}, ended
    assert ended["next"].startswith(f"Done. nitro_compare(group='{group_id}')")  # budget: an end
    assert [m["n"] for m in itself["spread"]["metrics"]] == [2] and itself["spread"][
        "left_out"
    ] == []
    assert unbudgeted == (True, (
        f"Error executing tool nitro_compare: group='{group_id}' and baseline='free' were scored "
        "under different budgets (max_epochs=2, max_steps=6 vs max_epochs=2), so their spreads "
        "do not compare. Compare against a baseline trained under the same budgets, e.g. a group "
        "started with the same call but for the change you test."
    ))  # fmt: skip


def _queue_only(tmp_path):
    """A server over ``tmp_path`` that starts no job (no slot): jobs stay queued, cheaply."""
    return build_server(tmp_path, max_jobs=0)


def test_nitro_jobs_pages_and_filters_groups_as_one_item_each(tmp_path):
    async def main():
        async with Client(_queue_only(tmp_path)) as client:
            ids = []
            for extra in ({"seeds": [0, 1, 2]}, {"run_dir": "runs/single"},
                          {"seeds": [0, 1, 2], "run_dir": "runs/b"}):  # fmt: skip
                err, reply = await call(client, "nitro_train", **TRAIN, **extra)
                assert not err, reply
                ids.append(reply["job_id"])
            paged, cursor = [], None
            with anyio.fail_after(600):
                while True:
                    args = {"limit": 1} | ({"cursor": cursor} if cursor else {})
                    err, page = await call(client, "nitro_jobs", **args)
                    assert not err and len(page["jobs"]) == 1, page
                    paged.append(page["jobs"][0])
                    cursor = page["next_cursor"]
                    if cursor is None:
                        break
            err, queued = await call(client, "nitro_jobs", state="queued")
            err2, done = await call(client, "nitro_jobs", state="succeeded")
            assert not err and not err2
            return ids, paged, queued, done

    ids, paged, queued, done = anyio.run(main)
    assert [j["job_id"] for j in paged] == ids[::-1]  # newest first, each group once
    assert [j["counts"] for j in paged] == [{"queued": 3}, None, {"queued": 3}]
    assert [j["run_dir"] for j in paged] == ["runs/b", "runs/single", "runs/Regression"]
    assert [j["job_id"] for j in queued["jobs"]] == ids[::-1] and done["jobs"] == []


def test_a_group_refuses_a_resume_source_and_names_the_seed_that_cannot_start(tmp_path):
    async def main():
        async with Client(_queue_only(tmp_path)) as client:
            resumed = await call(client, "nitro_train", **TRAIN, seeds=[0, 1],
                                 resume="latest => best")  # fmt: skip
            err, busy = await call(client, "nitro_train", **TRAIN,
                                   run_dir="runs/Regression/seed-1")  # fmt: skip
            assert not err, busy
            blocked = await call(client, "nitro_train", **TRAIN, seeds=[0, 1])
            return resumed, busy, blocked

    resumed, busy, blocked = anyio.run(main)
    assert resumed == (True, (
        "Error executing tool nitro_train: seeds=[0, 1] with resume='latest => best' would "
        "resume one record under every seed (a resume keeps its record's seed), so the group "
        "would have no spread. Send weights='latest => best' to start each seed from that "
        "record, or resume='auto' to continue a group's own runs."
    ))  # fmt: skip
    assert blocked[0] and blocked[1].startswith(
        "Error executing tool nitro_train: seeds=[0, 1]: seed 1's run "
        "(runs/Regression/seed-1) cannot start, so no seed started: "
    ), blocked
    assert busy["job_id"] in blocked[1]  # the job in the way, as a single run's refusal names it
    assert [p.name for p in (tmp_path / ".nitro" / "jobs").iterdir()] == [busy["job_id"]]
    assert not (tmp_path / ".nitro" / "groups").exists()  # nothing of a group was written


def test_a_group_file_nitro_did_not_write_is_refused_and_the_listing_still_answers(tmp_path):
    async def main():
        async with Client(_queue_only(tmp_path)) as client:
            err, started = await call(client, "nitro_train", **TRAIN, seeds=[0, 1])
            assert not err, started
            group_id = started["job_id"]
            path = tmp_path / ".nitro" / "groups" / f"{group_id}.json"
            good = json.loads(path.read_text())
            replies = []
            for bad in ({**good, "jobs": []}, {**good, "group": "group-20260101-000000-abcdef"},
                        {**good, "jobs": [good["jobs"][0], "../../elsewhere"]}):  # fmt: skip
                path.write_text(json.dumps(bad))
                replies.append(await call(client, "nitro_status", job_id=group_id))
                replies.append(await call(client, "nitro_jobs"))
            trailing = await call(client, "nitro_status", job_id=group_id + "\n")
            return group_id, replies, trailing

    group_id, replies, trailing = anyio.run(main)
    statuses, listings = replies[0::2], replies[1::2]
    for err, text in statuses:
        assert err and f"No group '{group_id}' under " in text, text
    assert "its file is not a group Nitro wrote" in statuses[0][1]
    assert "its file names another group, 'group-20260101-000000-abcdef'" in statuses[1][1]
    for err, page in listings:  # the group's row, as the job index has it, without counts
        assert not err and [(j["job_id"], j["counts"]) for j in page["jobs"]] == [(group_id, None)]
    assert trailing[0] and "is not a job id" in trailing[1], trailing


class ManyMetrics(Regression):
    """Regression scored under twelve metrics (the loss scaled; the last one shifted by
    ``offset``), for the bounds and the verdict."""

    offset: float = 0.0

    def metrics(self, model, batch):
        err = ((model(batch["x"]) - batch["y"]) ** 2).sum()
        out = {f"m{i:02d}": (err * (i + 1), len(batch["y"])) for i in range(12)}
        out["m11"] = (out["m11"][0] + self.offset * len(batch["y"]), len(batch["y"]))
        return out

    def eval_loss(self):
        return True


def _finished_group(root, name: str, runs: list[tuple[Path, str]]) -> str:
    """A seed group whose jobs ended, one per (run directory, run id), written into the job
    store as a server writes it: the jobs' spec and status files and the group's file."""
    group_id = f"group-20260101-00000{name}-abcdef"
    jobs = []
    for i, (run_dir, run) in enumerate(runs):
        job_id = f"20260101-00000{name}-{i:06x}"
        directory = job_dir(root, job_id)
        directory.mkdir(parents=True)
        call = TrainCall(experiment="Regression", run_dir=str(run_dir))
        write_json(directory / "spec.json", JobSpec(job_id=job_id, kind="train", call=call,
                                                    created=now_iso(), group=group_id))  # fmt: skip
        write_json(directory / "status.json", JobStatus(
            job_id=job_id, kind="train", state="succeeded", run_dir=str(run_dir), run_id=run,
            created=now_iso(), ended=now_iso(),
        ))  # fmt: skip
        jobs.append(job_id)
    group = Group(group=group_id, experiment="Regression", run_dir=str(runs[0][0].parent),
                  seeds=list(range(len(runs))), jobs=jobs, run_dirs=[str(d) for d, _ in runs],
                  created=now_iso())  # fmt: skip
    write_group(root / ".nitro", group)
    return group_id


def _trained(run_dir: Path, seed: int, exp=None) -> tuple[Path, str]:
    n = Nitro(exp or Regression(max_epochs=1, samples=16, batch_size=8), run_dir=run_dir, seed=seed)
    n.train()
    return run_dir, n.run_id


def test_a_baseline_without_spread_is_never_within_noise_and_nan_is_no_sample(tmp_path):
    root = tmp_path
    a, b = (_trained(root / "runs" / "x" / f"seed-{s}", s) for s in (0, 1))
    same = [_trained(root / "runs" / "same" / f"seed-{s}", 0) for s in (0, 1)]  # one seed twice
    group = _finished_group(root, "1", [a, b])
    flat = _finished_group(root, "2", same)

    async def main():
        async with Client(build_server(root)) as client:
            return await call(client, "nitro_compare", group=group, baseline=flat)

    err, reply = anyio.run(main)
    assert not err, reply
    (loss,) = reply["spread"]["metrics"]
    assert loss["baseline_std"] == 0 and loss["difference"] != 0
    assert loss["sigmas"] is None and loss["within_noise"] is None  # no floor: no verdict
    assert "agree exactly on loss (std 0): no noise floor" in reply["spread"]["note"]
    # a NaN is left out of the sample: n counts the finite values
    from nitro_mcp.group_compare import _stats

    assert _stats([1.0, float("nan"), 3.0]) == (2.0, statistics.stdev([1.0, 3.0]), 2)
    assert _stats([float("nan")]) == (None, None, 0)


def test_a_group_of_16_seeds_with_12_metrics_stays_within_the_reply_bound(tmp_path):
    root = tmp_path
    deep = root / ("d" * 100) / ("e" * 100)
    exp = ManyMetrics(max_epochs=1, samples=16, batch_size=8)
    runs = [_trained(deep / f"seed-{s}", s, exp) for s in range(2)]
    group = _finished_group(root, "1", runs * 8)  # 16 jobs, each run counted as one seed
    base = _finished_group(root, "2", runs[::-1] * 8)

    async def main():
        async with Client(build_server(root)) as client:
            compared = await call(client, "nitro_compare", group=group, baseline=base)
            status = await call(client, "nitro_status", job_id=group)
            return compared, status

    (err, reply), (err2, status) = anyio.run(main)
    assert not err and not err2, (reply, status)
    assert len(json.dumps(reply, separators=(",", ":"))) <= REPLY_MAX
    assert len(json.dumps(status, separators=(",", ":"))) <= REPLY_MAX
    spread = reply["spread"]
    assert len(spread["metrics"]) == 8 and spread["metrics_omitted"] == 5  # loss and 12
    assert [m["metric"] for m in spread["metrics"]][:2] == ["loss", "m00"]  # the ranked first
    assert all(m["n"] == 16 for m in spread["metrics"])
    assert all(len(j["last_val"]) <= 3 for j in status["group"]["jobs"])


def test_the_verdict_weighs_the_metrics_the_reply_leaves_out(tmp_path):
    root = tmp_path
    plain = ManyMetrics(max_epochs=1, samples=16, batch_size=8)
    shifted = ManyMetrics(max_epochs=1, samples=16, batch_size=8, offset=1000.0)
    group = _finished_group(
        root, "1", [_trained(root / "a" / f"seed-{s}", s, plain) for s in (0, 1)]
    )
    base = _finished_group(
        root, "2", [_trained(root / "b" / f"seed-{s}", s, shifted) for s in (0, 1)]
    )

    async def main():
        async with Client(build_server(root)) as client:
            return await call(client, "nitro_compare", group=group, baseline=base)

    err, reply = anyio.run(main)
    assert not err, reply
    spread = reply["spread"]
    assert "m11" not in [m["metric"] for m in spread["metrics"]] and spread["metrics_omitted"] == 5
    assert all(m["within_noise"] for m in spread["metrics"])  # the 8 shown agree
    assert spread["note"].endswith(f"Against {base}: beyond noise (|sigmas| >= 2): m11.")
