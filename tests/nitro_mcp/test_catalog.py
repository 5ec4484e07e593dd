"""Finding, comparing, deleting and exporting runs through a real MCP client: nitro_runs
without a directory, nitro_compare, nitro_delete (a dry run first), nitro_export and
nitro_jobs(prune_older_than_h=...). Runs are tiny and trained in-process; every reply is
checked against the 8,000-character bound."""

from __future__ import annotations

import json
import os
from pathlib import Path

import anyio
import pytest
from mcp import Client
from pydantic import create_model
from safetensors.torch import load_file

from nitro_core import Checkpointer, Last, Nitro, NitroWarning, checkpoint_info, read_manifest
from nitro_core.examples.regression import Regression
from nitro_core.jobs import JobManager
from nitro_core.jobs.call_models import TrainCall
from nitro_core.store import manifest
from nitro_mcp.server import build_server

from .conftest import call

SMALL = {"hidden": 8, "samples": 64, "max_epochs": 2}


class KeepAll(Regression):
    def checkpointer(self):  # every record kept, under a long name
        return Checkpointer(keep=Last(100), name="n" * 150)


# thirty plain fields of long text: a comparison of runs that differ in all of them
Wide = create_model("Wide", __base__=KeepAll, **{f"f{i:02d}": (str, "") for i in range(30)})


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


def tree_bytes(directory: Path) -> int:
    return sum(
        (Path(base) / f).lstat().st_size
        for base, _, files in os.walk(directory)
        for f in files
        if not (Path(base) / f).is_symlink()
    )


@pytest.fixture
def root(tmp_path):
    """runs/reg: run a, and run b branched from a's best with weights= and another lr (and
    max_epochs, a Host field); runs/other: one run with another hidden. Beside them, places
    the walk must skip: a virtual environment, node_modules, a hidden directory, a link."""
    reg, other = tmp_path / "runs" / "reg", tmp_path / "runs" / "other"
    a = Nitro(Regression(**SMALL), run_dir=reg).train().run_id
    best = min(read_manifest(reg), key=lambda e: e.score)
    with pytest.warns(NitroWarning, match="trained under another config"):
        b = Nitro(Regression(**{**SMALL, "lr": 0.05, "max_epochs": 3}), run_dir=reg,
                  weights=f"{a} => best").train().run_id  # fmt: skip
    c = Nitro(Regression(**{**SMALL, "hidden": 16}), run_dir=other).train().run_id
    for hidden in ("myenv/lib/x", "node_modules/pkg", ".cache/x", ".nitro/x"):
        (tmp_path / hidden).mkdir(parents=True)
        (tmp_path / hidden / "manifest.json").write_text("{}")
    (tmp_path / "myenv" / "pyvenv.cfg").write_text("home = /usr\n")
    (tmp_path / "linked").symlink_to(tmp_path / "runs")
    return tmp_path, {"a": a, "b": b, "c": c, "best": best.file}


def run_calls(root: Path, *calls: tuple[str, dict], max_jobs: int = 2) -> list[tuple[bool, object]]:
    """Make the calls in order over one in-process client; each reply is bounded."""

    async def main():
        out = []
        async with Client(build_server(root, max_jobs=max_jobs)) as client:
            for name, args in calls:
                err, reply = await call(client, name, **args)
                size = len(reply) if err else len(json.dumps(reply))
                assert size < 8000, (name, size)
                out.append((err, reply))
        return out

    return anyio.run(main)


# -- nitro_runs ------------------------------------------------------------------------------------
def test_nitro_runs_without_a_directory_lists_every_run_directory_under_the_root(root):
    tmp, ids = root
    [(err, listing)] = run_calls(tmp, ("nitro_runs", {}))
    assert not err, listing
    assert [d["run_dir"] for d in listing["run_dirs"]] == ["runs/other", "runs/reg"]
    reg = listing["run_dirs"][1]
    entries = read_manifest(tmp / "runs/reg")
    points = manifest.read_points(tmp / "runs/reg")
    scores = [e.score for e in entries] + [p.score for pts in points.values() for p in pts]
    config = checkpoint_info(tmp / "runs/reg" / entries[-1].file)["config"]
    assert reg == {
        "run_dir": "runs/reg", "runs": [ids["a"], ids["b"]], "run_count": 2,
        "checkpoints": len(entries), "experiment": "Regression",
        "config": ", ".join(f"{k}={json.dumps(v)}" for k, v in config.items()),
        "metric": "loss", "mode": "min", "best_score": min(scores), "best_run": ids["b"],
        "last_written": entries[-1].written, "parent": f"{ids['a']}/{ids['best']}",
        "parent_diff": {"lr": [0.01, 0.05], "max_epochs": [2, 3]},
        "bytes": tree_bytes(tmp / "runs/reg"), "error": None,
    }  # fmt: skip
    assert reg["config"].startswith("max_epochs=3, features=8, hidden=8, samples=64")
    assert listing["total"] == 2 and listing["next_cursor"] is None and listing["runs"] == []
    assert listing["hint"] == (
        "nitro_runs(run_dir='runs/other') shows one directory's runs; "
        "nitro_compare(sources=['runs/other', 'runs/reg']) compares two."
    )


def test_nitro_runs_on_a_directory_without_a_manifest_names_the_run_directories_below(root):
    tmp, _ = root
    (tmp / "empty").mkdir()
    [(err, below), (err2, none)] = run_calls(
        tmp, ("nitro_runs", {"run_dir": "runs"}), ("nitro_runs", {"run_dir": "empty"})
    )
    assert not err and not err2
    assert below["run_dir"] == "runs" and below["runs"] == []
    assert [d["run_dir"] for d in below["run_dirs"]] == ["runs/other", "runs/reg"]
    assert below["hint"] == (
        "runs/ holds no manifest; run directories below it: runs/other, runs/reg. "
        "Call nitro_runs(run_dir='runs/other')."
    )
    assert none["run_dirs"] == [] and none["hint"] == (
        "empty/ holds no manifest, and no directory below it does; nitro_runs() lists every "
        "run directory under the root."
    )


def test_nitro_runs_pages_many_run_directories_under_the_reply_bound(root):
    tmp, _ = root
    body = (tmp / "runs/reg/manifest.json").read_bytes()
    names = [f"runs/many/{'d' * 120}-{i:03d}" for i in range(60)]
    for name in names:
        (tmp / name).mkdir(parents=True)
        (tmp / name / "manifest.json").write_bytes(body)  # its records are elsewhere: unread
    seen, cursor, pages = [], None, 0
    while True:
        args = {"limit": 100} | ({"cursor": cursor} if cursor else {})
        [(err, page)] = run_calls(tmp, ("nitro_runs", args))
        assert not err, page
        seen += [d["run_dir"] for d in page["run_dirs"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(names) + ["runs/other", "runs/reg"] and pages > 2
    assert page["total"] == 62


# -- nitro_compare ---------------------------------------------------------------------------------
def test_nitro_compare_shows_the_plain_fields_that_differ_metrics_wall_time_and_parent(root):
    tmp, ids = root
    a, b, c = ids["a"], ids["b"], ids["c"]
    [(err, out)] = run_calls(tmp, ("nitro_compare", {"sources": ["runs/reg:all", "runs/other"]}))
    assert not err, out
    assert [r["source"] for r in out["runs"]] == [
        f"runs/reg:{a}",
        f"runs/reg:{b}",
        f"runs/other:{c}",
    ]
    assert out["config_diff"] == {
        "hidden": [8, 8, 16],
        "lr": [0.01, 0.05, 0.01],
    }  # max_epochs: Host
    assert out["config_diff_omitted"] == 0
    rows = [
        json.loads(line) for line in (tmp / f"runs/reg/logs/{b}.jsonl").read_text().splitlines()
    ]
    points = manifest.read_points(tmp / "runs/reg")[b]
    run_b = out["runs"][1]
    assert run_b == {
        "source": f"runs/reg:{b}", "experiment": "Regression", "epochs": 3, "step": points[-1].step,
        "checkpoints": len([e for e in read_manifest(tmp / "runs/reg") if e.run == b]),
        "metric": "loss", "mode": "min", "best_score": min(p.score for p in points),
        "best_epoch": min(points, key=lambda p: p.score).epoch,
        "final": {"loss": rows[-1]["val"]["loss"], "train_loss": rows[-1]["train_loss"]},
        "wall_s": round(sum(r["seconds"] for r in rows), 3), "wall_from": "log",
        "parent": f"{a}/{ids['best']}", "parent_diff": {"lr": [0.01, 0.05], "max_epochs": [2, 3]},
        "stop_reason": "completed",
    }  # fmt: skip
    assert out["runs"][0]["parent"] is None and out["runs"][0]["epochs"] == 2
    assert out["runs"][0]["parent_diff"] is None


def test_a_resume_branch_shows_its_parent_and_the_fields_it_changed_and_keeps_them(tmp_path):
    """Lineage through resume=: a branch from an earlier record (with another max_epochs, the
    only kind of field a resume may change) names that record and the change; continuing the
    branch keeps its parent and shows the latest value; the original run has no lineage."""
    reg = tmp_path / "runs" / "reg"
    a = Nitro(Regression(**{**SMALL, "max_epochs": 3}), run_dir=reg).train().run_id
    first = read_manifest(reg)[0]
    with pytest.warns(NitroWarning, match="branches into a new run"):
        d = Nitro(Regression(**{**SMALL, "max_epochs": 4}), run_dir=reg,
                  resume=str(reg / first.file)).train().run_id  # fmt: skip
    head = checkpoint_info(reg / read_manifest(reg)[-1].file)
    assert head["run"] == d and head["parent_diff"] == {"max_epochs": [3, 4]}
    [(err, out)] = run_calls(tmp_path, ("nitro_compare", {"sources": ["runs/reg:all"]}))
    assert not err, out
    lineage = {r["source"]: (r["parent"], r["parent_diff"]) for r in out["runs"]}
    assert lineage == {
        f"runs/reg:{a}": (None, None),
        f"runs/reg:{d}": (f"{a}/{first.file}", {"max_epochs": [3, 4]}),
    }
    # continued under its own id with a longer budget: the same parent, the latest value
    again = Nitro(Regression(**{**SMALL, "max_epochs": 5}), run_dir=reg, resume="auto").train()
    assert again.run_id == d
    [(err, listing)] = run_calls(tmp_path, ("nitro_runs", {}))
    assert not err, listing
    (summary,) = listing["run_dirs"]
    assert (summary["parent"], summary["parent_diff"]) == (
        f"{a}/{first.file}", {"max_epochs": [3, 5]},
    )  # fmt: skip


def test_nitro_compare_falls_back_to_the_records_history_without_a_log(root):
    tmp, ids = root
    (tmp / f"runs/other/logs/{ids['c']}.jsonl").unlink()
    [(err, out)] = run_calls(
        tmp, ("nitro_compare", {"sources": [f"runs/reg:{ids['a']}", "runs/other"]})
    )
    assert not err, out
    history = checkpoint_info(tmp / "runs/other" / read_manifest(tmp / "runs/other")[-1].file)[
        "history"
    ]
    other = out["runs"][1]
    assert other["wall_from"] == "record"
    assert other["wall_s"] == round(sum(r["seconds"] for r in history), 3)
    assert other["final"] == {
        "loss": history[-1]["val"]["loss"],
        "train_loss": history[-1]["train_loss"],
    }


def test_nitro_compare_and_nitro_delete_stay_under_the_reply_bound_for_big_runs(tmp_path):
    wide = tmp_path / "runs" / "wide"
    for i in range(8):
        fields = {f"f{k:02d}": f"{'x' * 70}{i}" for k in range(30)}
        Nitro(Wide(samples=16, batch_size=16, max_epochs=1 if i else 20, **fields),
              run_dir=wide).train()  # fmt: skip
    first = read_manifest(wide)[0].run
    [(e1, out), (e2, dry)] = run_calls(
        tmp_path, ("nitro_compare", {"sources": ["runs/wide:all"]}),
        ("nitro_delete", {"run_dir": "runs/wide", "run": first}),
    )  # fmt: skip
    assert not e1 and not e2
    assert len(out["runs"]) == 8 and out["config_diff_omitted"] > 0
    assert len(out["config_diff"]) + out["config_diff_omitted"] == 30
    assert dry["files_total"] == 21 and 0 < len(dry["files"]) < 21  # 20 records and the log


@pytest.mark.parametrize(
    "sources, message",
    [
        (["runs/reg"], "sources=['runs/reg'] names 1 run; nitro_compare compares 2 to 8, e.g. "
         "sources=['runs/a', 'runs/b:a1b2c3d4'] (a directory alone is its latest run; 'runs/a:all' "
         "is each of its runs)."),
        (["runs/reg"] * 9, "sources names 9 runs; nitro_compare compares 2 to 8 at once, e.g. "
         "sources=['runs/a', 'runs/b:a1b2c3d4']."),
        (["runs/reg", "runs"], "sources[1]='runs': runs holds no manifest.json, so it is no run "
         "directory; nitro_runs() lists the run directories under the root."),
        (["runs/reg", "runs/other:zz"], "sources[1]='runs/other:zz': runs/other has no run 'zz'; "
         "write one of 'runs/other:{c}'."),
        (["runs/reg", "../elsewhere"], "sources[1]='../elsewhere' resolves to"),
    ],
)  # fmt: skip
def test_nitro_compare_refusals_name_the_sources_to_write(root, sources, message):
    tmp, ids = root
    [(err, text)] = run_calls(tmp, ("nitro_compare", {"sources": sources}))
    assert err and text.startswith("Error executing tool nitro_compare: ")
    assert text.removeprefix("Error executing tool nitro_compare: ").startswith(
        message.format(c=ids["c"])
    ), text
    if not message.endswith("resolves to"):
        assert text.endswith(message.format(c=ids["c"]))


# -- nitro_delete ----------------------------------------------------------------------------------
def test_nitro_delete_shows_a_dry_run_then_deletes_only_that_run(root):
    tmp, ids = root
    a, b = ids["a"], ids["b"]
    before = snapshot(tmp)
    kept = manifest.load(tmp / "runs/reg")
    [(err, dry)] = run_calls(tmp, ("nitro_delete", {"run_dir": "runs/reg", "run": a}))
    assert not err, dry
    assert snapshot(tmp) == before  # a dry run changes nothing, byte for byte
    mine = [e for e in kept.entries if e.run == a]
    going = [e.file for e in mine] + [f"logs/{a}.jsonl"]
    sizes = {f: len(before[f"runs/reg/{f}"]) for f in going}
    assert dry == {
        "run_dir": "runs/reg", "dry_run": True,
        "files": [{"file": f, "run": a, "epoch": next((e.epoch for e in mine if e.file == f), None),
                   "bytes": sizes[f]} for f in going],
        "files_total": len(going), "entries": len(mine), "runs": [a], "points": len(kept.points[a]),
        "bytes": sum(sizes.values()), "missing": [], "skipped": [],
        "next": f"Dry run: nothing was deleted. nitro_delete(run_dir='runs/reg', run='{a}', "
        f"dry_run=false) deletes these {len(going)} files ({sum(sizes.values()) / 1000:.1f} kB) "
        f"and {len(mine)} manifest entries.",
    }  # fmt: skip
    [(err, done)] = run_calls(
        tmp, ("nitro_delete", {"run_dir": "runs/reg", "run": a, "dry_run": False})
    )
    assert not err and done["dry_run"] is False and done["files"] == dry["files"]
    assert done["next"] == (
        f"Deleted {len(going)} files ({sum(sizes.values()) / 1000:.1f} kB) and {len(mine)} "
        "manifest entries. nitro_runs(run_dir='runs/reg') shows what remains."
    )
    after = snapshot(tmp)
    gone = {f"runs/reg/{f}" for f in going}
    assert not gone & set(after)
    assert {k for k in before if k not in gone and before[k] != after[k]} == {
        "runs/reg/manifest.json"
    }
    now = manifest.load(tmp / "runs/reg")
    assert now.entries == [e for e in kept.entries if e.run == b]
    assert now.points == {b: kept.points[b]}


def test_nitro_delete_of_some_files_refuses_a_file_of_another_run(root):
    tmp, ids = root
    other_file = next(e.file for e in read_manifest(tmp / "runs/reg") if e.run == ids["b"])
    before = snapshot(tmp)
    [(err, text)] = run_calls(
        tmp, ("nitro_delete", {"run_dir": "runs/reg", "run": ids["a"], "files": [other_file],
                               "dry_run": False}),
    )  # fmt: skip
    assert err and text == (
        f"Error executing tool nitro_delete: files: {other_file!r} belongs to run {ids['b']}, not "
        f"to run='{ids['a']}', and a deletion never touches another run's files. Drop it from "
        "files, or leave run out."
    )
    assert snapshot(tmp) == before


def test_nitro_delete_is_refused_while_a_job_uses_the_directory(root):
    tmp, ids = root
    jobs = JobManager(tmp, max_jobs=0)  # queued, never started: it stays queued
    here = jobs.submit(TrainCall(experiment="Regression", run_dir=str(tmp / "runs/reg")))
    reads = jobs.submit(TrainCall(
        experiment="Regression", run_dir=str(tmp / "runs/other"), weights=f"runs/reg/{ids['best']}",
    ))  # fmt: skip
    before = snapshot(tmp / "runs")
    calls = [("nitro_delete", {"run_dir": "runs/reg", "run": ids["a"], "dry_run": False}),
             ("nitro_stop", {"job_id": here.job_id}),
             ("nitro_delete", {"run_dir": "runs/reg", "run": ids["a"], "dry_run": False}),
             ("nitro_stop", {"job_id": reads.job_id}),
             ("nitro_delete", {"run_dir": "runs/reg", "run": ids["a"], "dry_run": False})]  # fmt: skip
    replies = run_calls(tmp, *calls, max_jobs=0)
    for (err, text), job in ((replies[0], here), (replies[2], reads)):
        assert err and text == (
            f"Error executing tool nitro_delete: run_dir='runs/reg' is in use by job {job.job_id} "
            f"(train, queued), which reads or writes its checkpoints; nothing was deleted. Stop it "
            f"with nitro_stop(job_id='{job.job_id}') or wait for its end with "
            f"nitro_status(job_id='{job.job_id}', wait_s=25, until='end', brief=true), then call nitro_delete again."
        )
    assert not replies[4][0] and replies[4][1]["runs"] == [ids["a"]]
    assert before != snapshot(tmp / "runs")


# -- nitro_export ----------------------------------------------------------------------------------
def test_nitro_export_writes_the_weights_inside_the_root_and_never_overwrites(root):
    tmp, ids = root
    args = {"source": "latest => best", "path": "exports/best.safetensors", "run_dir": "runs/reg"}
    [(err, out), (err2, again), (err3, outside), (err4, no_dir)] = run_calls(
        tmp, ("nitro_export", args), ("nitro_export", args),
        ("nitro_export", {**args, "path": "../x.safetensors"}),
        ("nitro_export", {"source": "latest => best", "path": "exports/x.safetensors"}),
    )  # fmt: skip
    assert not err, out
    best = min(
        (e for e in read_manifest(tmp / "runs/reg") if e.run == ids["b"]), key=lambda e: e.score
    )
    weights = load_file(tmp / "exports/best.safetensors")
    model = Regression(**SMALL).build_model()
    model.load_state_dict(weights)  # every parameter, under its state-dict name
    assert out == {
        "path": "exports/best.safetensors", "bytes": (tmp / "exports/best.safetensors").stat().st_size,
        "source_file": f"runs/reg/{best.file}", "run": ids["b"], "epoch": best.epoch,
        "step": best.step, "experiment": "Regression", "averaged_files": None,
        "next": "model.load_state_dict(safetensors.torch.load_file(path)) restores the weights; "
        "nitro_checkpoint_info(path='exports/best.safetensors') shows where they came from.",
    }  # fmt: skip
    assert err2 and again == (
        "Error executing tool nitro_export: path='exports/best.safetensors' already exists; "
        "Nitro never overwrites it. Choose a new name."
    )
    assert err3 and "outside the server's root" in outside
    assert err4 and no_dir == (
        "Error executing tool nitro_export: source='latest => best' names a checkpoint of a run, "
        "so it needs run_dir; write nitro_export(source='latest => best', "
        "path='exports/x.safetensors', run_dir='runs/Classifier')."
    )
    assert not (tmp / "exports/x.safetensors").exists()


# -- nitro_jobs(prune_older_than_h=...) ------------------------------------------------------------
def test_nitro_jobs_prunes_ended_job_directories_and_never_a_queued_one(root):
    tmp, _ = root
    jobs = JobManager(tmp, max_jobs=0)
    ended = [jobs.submit(TrainCall(experiment="Regression", run_dir=str(tmp / "runs/x")))
             for _ in range(2)]  # fmt: skip
    for job in ended:
        jobs.stop(job.job_id)  # a queued job stopped: ended now
    queued = jobs.submit(TrainCall(experiment="Regression", run_dir=str(tmp / "runs/x")))
    store = tmp / ".nitro" / "jobs"
    before = snapshot(store)
    size = sum(len(v) for k, v in before.items() if k.startswith(ended[0].job_id + "/"))
    [(e1, young), (e2, dry), (e3, done), (e4, bad)] = run_calls(
        tmp,
        ("nitro_jobs", {"prune_older_than_h": 1, "dry_run": False}),
        ("nitro_jobs", {"prune_older_than_h": 0}),
        ("nitro_jobs", {"prune_older_than_h": 0, "dry_run": False}),
        ("nitro_jobs", {"prune_older_than_h": -1}),
        max_jobs=0,
    )
    assert not (e1 or e2 or e3)
    assert young["pruned"]["count"] == 0 and len(young["jobs"]) == 3  # ended a moment ago
    ids = [j.job_id for j in ended]
    assert dry["pruned"]["jobs"] == ids and dry["pruned"]["dry_run"] is True
    assert dry["pruned"]["bytes"] >= 2 * size > 0
    assert dry["pruned"]["next"] == (
        f"Dry run: nothing was removed. nitro_jobs(prune_older_than_h=0, dry_run=false) removes "
        f"these 2 job directories ({dry['pruned']['bytes'] / 1000:.1f} kB)."
    )
    assert done["pruned"]["jobs"] == ids and [j["job_id"] for j in done["jobs"]] == [queued.job_id]
    assert sorted(p.name for p in store.iterdir()) == [queued.job_id]
    assert snapshot(store / queued.job_id) == {
        k.split("/", 1)[1]: v for k, v in before.items() if k.startswith(queued.job_id + "/")
    }
    assert e4 and bad == (
        "Error executing tool nitro_jobs: prune_older_than_h=-1.0 is out of range; give the "
        "hours since a job ended, 0 or more, e.g. prune_older_than_h=24."
    )
