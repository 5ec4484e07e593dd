"""Replies an agent can afford: every tool's default reply stays under 8,000 characters of
compact JSON whatever the run holds, and the tool listing, every tool's output schema
included, under ``replies.LISTING_MAX`` characters."""

from __future__ import annotations

import json
import os

import anyio
import pytest
from mcp import Client
from pydantic import BaseModel

from nitro_core import Nitro, average_checkpoints
from nitro_core.errors import (
    WEIGHTS_ONLY,
    CheckpointerFix,
    CheckpointNotFound,
    ConfigError,
    ResumeRefused,
)
from nitro_core.examples import Regression
from nitro_core.jobs import JobManager
from nitro_core.jobs.call_models import TrainCall
from nitro_core.jobs.files import job_dir
from nitro_core.jobs.status import update_status_if
from nitro_mcp.replies import LISTING_MAX
from nitro_mcp.server import build_server

REPLY_MAX = 8_000
RUN_DIR = "runs/big"
SYNTHETIC_RUNS = 60  # runs in the directory besides the real one
BIG_RUN = "b16b16b1"  # a run of 300 kept entries, points and log rows


def _entry(real: dict, run: str, epoch: int, file: str) -> dict:
    return {**real, "file": file, "epoch": epoch, "step": epoch * 10, "score": 1.0 / epoch, "run": run,
            "stop_reason": None, "parent": f"{BIG_RUN}/{real['file']}", "keep": "(Best(3), Last(10), Every(5))"}  # fmt: skip


@pytest.fixture(scope="module")
def big_root(tmp_path_factory):
    """A root whose run directory holds 500-odd manifest entries over 61 runs (one of 300
    entries), long metric logs, a record averaged from 300, and jobs with a long log, error,
    hint and result."""
    root = tmp_path_factory.mktemp("big")
    run_dir = root / RUN_DIR
    real = Nitro(Regression(max_epochs=2, samples=64), run_dir=run_dir).train()
    manifest = json.loads((run_dir / "manifest.json").read_text())
    first = manifest["entries"][0]
    entries, points = [], {}
    for r in range(SYNTHETIC_RUNS):
        run = BIG_RUN if r == 0 else f"{r:08x}"
        for epoch in range(1, (300 if r == 0 else 4) + 1):
            name = f"{run}-epoch-{epoch:05d}-a-long-descriptive-record-name.safetensors"
            os.link(run_dir / first["file"], run_dir / name)  # real bytes, no disk spent
            entries.append(_entry(first, run, epoch, name))
            points.setdefault(run, []).append(
                {"epoch": epoch, "step": epoch * 10, "score": 1.0 / epoch, "metric": "loss", "mode": "min"}
            )  # fmt: skip
    manifest["entries"] = entries + manifest["entries"]  # the real run stays the latest
    manifest["points"] = {**points, **manifest["points"]}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    row = json.loads((run_dir / "logs" / f"{real.run_id}.jsonl").read_text().splitlines()[-1])
    for run in (BIG_RUN, real.run_id):
        with open(run_dir / "logs" / f"{run}.jsonl", "a") as log:
            for epoch in range(3, 3003):
                log.write(json.dumps({**row, "run": run, "epoch": epoch, "step": epoch}) + "\n")
    jobs = JobManager(root, max_jobs=0)
    failed = jobs.submit(TrainCall(experiment="Regression", run_dir=str(run_dir),
                                   overrides={"max_epochs": 3000, "samples": 64}))  # fmt: skip
    update_status_if(
        job_dir(root, failed.job_id), {"queued"}, state="failed", phase="failed", run_id=BIG_RUN, epoch=300,
        step=3000, last_loss=0.5, last_val={f"metric_{i}": 0.5 for i in range(40)},
        error="RuntimeError: " + "e" * 20_000, hint="h" * 1000,
        result={"warnings": ["w" * 500] * 20, "kept": [e["file"] for e in entries[-20:]], "kept_total": 300,
                "run_id": BIG_RUN, "final_val": {f"metric_{i}": 0.5 for i in range(40)}},
    )  # fmt: skip
    with open(job_dir(root, failed.job_id) / "log.txt", "w") as log:
        log.write("a line of the worker's log that goes on for a while\n" * 20_000)
    queued = jobs.submit(TrainCall(experiment="Regression", run_dir=str(root / "runs/other")))
    # a record averaged from 300 others: its header names each of them
    average_checkpoints(
        run_dir, f"{BIG_RUN} => Average(Last(300))", save=run_dir / "avg300.safetensors"
    )
    return root, f"{RUN_DIR}/avg300.safetensors", failed.job_id, queued.job_id


def _defaults(record: str, failed: str, queued: str) -> dict[str, dict]:
    """The arguments each tool needs (only those it requires, plus wait_s=0 so that a call
    returns at once); a tool missing here fails the test by name."""
    return {
        "nitro_train": {"experiment": "Regression", "run_dir": "runs/fresh"},
        "nitro_validate": {"experiment": "Regression", "run_dir": RUN_DIR, "wait_s": 0},
        "average": {"run_dir": RUN_DIR, "wait_s": 0},
        "nitro_status": {"job_id": failed},
        "nitro_jobs": {},
        "nitro_stop": {"job_id": queued},
        "nitro_runs": {"run_dir": RUN_DIR},
        "nitro_manifest": {"run_dir": RUN_DIR},
        "nitro_checkpoint_info": {"path": record},
        "nitro_verify": {"path": RUN_DIR},
        "nitro_experiments": {},
        "nitro_history": {"run_dir": RUN_DIR},
        "nitro_plot": {"run_dir": RUN_DIR},
        "nitro_compare": {"sources": [f"{RUN_DIR}:{BIG_RUN}", RUN_DIR]},
        "nitro_delete": {"run_dir": RUN_DIR},
        "nitro_export": {
            "source": "latest => best",
            "run_dir": RUN_DIR,
            "path": "exported.safetensors",
        },
    }


def _text(result) -> str:
    return "".join(c.text for c in result.content if c.type == "text")


def test_every_default_reply_stays_under_8000_characters(big_root):
    root, record, failed, queued = big_root
    defaults = _defaults(record, failed, queued)

    async def main():
        sizes = {}
        async with Client(build_server(root, max_jobs=0)) as client:
            tools = (await client.list_tools()).tools
            missing = [t.name for t in tools if t.name not in defaults]
            assert not missing, f"add default arguments for {missing} to _defaults in this test"
            # the dry run of nitro_delete first: later calls start jobs that use the directory
            for tool in sorted(tools, key=lambda t: t.name != "nitro_delete"):
                result = await client.call_tool(tool.name, defaults[tool.name])
                text = _text(result)
                sizes[tool.name] = (len(text), result.is_error, text[:300])
                print(tool.name, sizes[tool.name])
                if result.structured_content is not None:  # the text is the same, compact
                    assert text == json.dumps(result.structured_content, separators=(",", ":"),
                                              ensure_ascii=False), tool.name  # fmt: skip
        return sizes

    sizes = anyio.run(main)
    too_big = {name: size for name, (size, _, _) in sizes.items() if size >= REPLY_MAX}
    assert not too_big, f"replies over {REPLY_MAX} characters: {too_big}"


def _keys(schema, key: str) -> int:
    """How often ``key`` is a keyword anywhere in ``schema`` (a property of that name is not)."""
    if isinstance(schema, list):
        return sum(_keys(s, key) for s in schema)
    if not isinstance(schema, dict):
        return 0
    here = sum(_keys(v, key) for k, v in schema.items() if k != "properties")
    inner = sum(_keys(v, key) for v in schema.get("properties", {}).values())
    return here + inner + (key in schema)


def _any_of(wire: str) -> int:
    """How many ``anyOf`` the listing holds."""
    return wire.count('"anyOf":')


class _Leaf(BaseModel):
    value: int


class _Shared(BaseModel):
    """A model naming ``_Leaf`` twice (shared) and itself (recursive)."""

    first: _Leaf
    second: _Leaf | None = None
    child: _Shared | None = None


class _Once(BaseModel):
    leaf: _Leaf | None = None


def test_the_listing_writes_a_definition_in_place_only_when_one_place_names_it():
    from nitro_mcp.replies import ListingSchema

    once = _Once.model_json_schema(schema_generator=ListingSchema)  # an argument: null by omission
    assert once == {"properties": {"leaf": {"properties": {"value": {"type": "integer"}},
                                            "required": ["value"], "type": "object"}},
                    "type": "object"}  # fmt: skip
    shared = _Shared.model_json_schema(schema_generator=ListingSchema)
    assert set(shared["$defs"]) == {"_Leaf", "_Shared"}  # named twice; itself
    assert shared["$ref"] == "#/$defs/_Shared"
    top = shared["$defs"]["_Shared"]["properties"]
    assert top["first"] == top["second"] == {"$ref": "#/$defs/_Leaf"}  # null by omission
    assert top["child"] == {"$ref": "#/$defs/_Shared"}


def test_a_replys_listing_names_its_fields_and_a_nested_model_as_an_object():
    from nitro_mcp.replies import OutputListingSchema

    once = _Once.model_json_schema(schema_generator=OutputListingSchema)  # a reply: null written
    assert once == {"properties": {"leaf": {"type": ["object", "null"]}}, "type": "object"}
    shared = _Shared.model_json_schema(schema_generator=OutputListingSchema)
    assert shared == {"properties": {"first": {"type": "object"},
                                     "second": {"type": ["object", "null"]},
                                     "child": {"type": ["object", "null"]}},
                      "type": "object"}  # fmt: skip
    assert "required" not in json.dumps(shared)  # a reply holds every field


def test_the_listing_carries_every_output_schema_within_its_budget_and_schemas_stay_complete(
    tmp_path,
):
    async def main():
        server = build_server(tmp_path)
        async with Client(server) as client:
            listed = (await client.list_tools()).tools
        return listed, await server.list_tools(full=True)

    listed, full = anyio.run(main)
    wire = json.dumps([t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed],
                      separators=(",", ":"))  # fmt: skip
    assert len(wire) < LISTING_MAX, f"tools/list is {len(wire)} characters"
    # every tool with a structured reply lists its output schema: each field, typed
    for tool in listed:
        if tool.name == "nitro_plot":  # image content
            assert tool.output_schema is None
            continue
        assert tool.output_schema["type"] == "object" and tool.output_schema["properties"], (
            tool.name
        )
        assert _keys([tool.input_schema, tool.output_schema], "title") == 0, tool.name
    status = next(t for t in listed if t.name == "nitro_status")
    # a nested model is an object (null among its types when optional); its fields are in
    # the complete schema (schemas/), as a list of models' are
    assert status.output_schema["properties"]["progress"] == {"type": ["object", "null"]}
    complete = next(t for t in full if t.name == "nitro_status").output_schema
    assert complete["$defs"]["InEpochProgress"]["properties"]["loss"]["anyOf"] == [
        {"type": "number"}, {"type": "null"},
    ]  # fmt: skip
    # a list of models (a page's entries, kept checkpoints) is an array of objects in the
    # listing; its items' fields are in the complete schema (schemas/)
    assert status.output_schema["properties"]["kept"] == {
        "items": {"type": "object"}, "type": ["array", "null"],
    }  # fmt: skip
    manifest_tool = next(t for t in listed if t.name == "nitro_manifest")
    assert manifest_tool.output_schema["properties"]["entries"] == {
        "items": {"type": "object"}, "type": "array",
    }  # fmt: skip
    assert status.output_schema["properties"]["last_val"]["additionalProperties"] == {
        "type": ["number", "null"]
    }  # a list or map of plain values keeps its items' type
    # null is one more type or enum value; no reply's model is named twice, so no anyOf
    assert status.output_schema["properties"]["kind"] == {
        "enum": ["train", "validate", "average", None]
    }
    assert _any_of(wire) == 0 and '"$ref"' not in wire and '"$defs"' not in wire
    # every output schema says nothing of required fields: a reply holds each of its fields
    assert all(_keys(t.output_schema, "required") == 0 for t in listed if t.output_schema)
    assert status.output_schema["properties"]["state"] == {
        "enum": ["queued", "running", "succeeded", "failed", "stopped", "lost"]
    }
    train = next(t for t in listed if t.name == "nitro_train")
    # an optional argument is listed by its type (leaving it out means null), without titles
    assert train.input_schema["properties"]["run_dir"] == {
        "type": "string", "description": "Run directory inside the root; default runs/<experiment>.",
    }  # fmt: skip
    # closed sets and bounds are in the schema an agent reads
    assert train.input_schema["properties"]["strategy"]["enum"] == ["auto", "ddp", "fsdp"]
    assert train.input_schema["properties"]["logger"]["enum"] == [
        "jsonl", "tensorboard", "mlflow", "wandb",
    ]  # fmt: skip
    nproc = train.input_schema["properties"]["nproc"]
    assert (nproc["minimum"], nproc["maximum"]) == (1, 64)
    assert train.output_schema["properties"]["next"] == {"type": "string"}
    # the complete schemas (what schemas/ holds) keep titles, descriptions and nested models
    full_train = next(t for t in full if t.name == "nitro_train")
    assert full_train.input_schema["properties"]["run_dir"]["title"] == "Run Dir"
    assert full_train.output_schema["properties"]["next"]["description"] == "What to call next."
    full_status = next(t for t in full if t.name == "nitro_status")
    kept = full_status.output_schema["$defs"]["KeptCheckpoint"]["properties"]
    assert kept["kept_by"]["items"] == {"type": "string"} and "file" in kept


def test_pages_bounded_by_size_still_cover_every_entry_once(big_root):
    root, *_ = big_root
    on_disk = [
        e["file"] for e in json.loads((root / RUN_DIR / "manifest.json").read_text())["entries"]
    ]

    async def main():
        files, runs, cursor, sizes = [], [], None, []
        async with Client(build_server(root, max_jobs=0)) as client:
            while True:
                result = await client.call_tool(
                    "nitro_manifest", {"run_dir": RUN_DIR, "cursor": cursor}
                )
                page = result.structured_content
                files += [e["file"] for e in page["entries"]]
                sizes.append(len(page["entries"]))
                if page["next_cursor"] is None:
                    break
                cursor = page["next_cursor"]
            cursor = None
            while True:
                page = (
                    await client.call_tool("nitro_runs", {"run_dir": RUN_DIR, "cursor": cursor})
                ).structured_content
                runs += [r["run"] for r in page["runs"]]
                if page["next_cursor"] is None:
                    return files, runs, sizes, page["total"]
                cursor = page["next_cursor"]

    files, runs, sizes, total = anyio.run(main)
    assert files == on_disk
    assert sizes[0] < 20  # long entries: the default page (limit 20) stops at the size bound
    assert len(runs) == len(set(runs)) == total == SYNTHETIC_RUNS + 1
    assert runs[-1] == BIG_RUN  # last written first: the synthetic runs came before the real one


def _spec(root, job_id: str) -> dict:
    """The call a job's spec stores."""
    return json.loads((job_dir(root, job_id) / "spec.json").read_text())["call"]


def test_resume_and_restore_best_take_booleans(tmp_path):
    async def main():
        async with Client(build_server(tmp_path, max_jobs=0)) as client:
            first = await client.call_tool("nitro_train", {"experiment": "Regression", "run_dir": "runs/a",
                                                          "resume": False, "restore_best": True})  # fmt: skip
            second = await client.call_tool("nitro_train", {"experiment": "Regression", "run_dir": "runs/b",
                                                           "resume": "auto", "restore_best": False})  # fmt: skip
            refused = await client.call_tool(
                "nitro_train", {"experiment": "Regression", "resume": True}
            )
            return first.structured_content, second.structured_content, _text(refused)

    first, second, refused = anyio.run(main)
    assert (
        _spec(tmp_path, first["job_id"])["resume"],
        _spec(tmp_path, first["job_id"])["restore_best"],
    ) == ("false", "true")
    assert (
        _spec(tmp_path, second["job_id"])["resume"],
        _spec(tmp_path, second["job_id"])["restore_best"],
    ) == ("auto", "false")
    assert refused == (
        "Error executing tool nitro_train: resume=true is ambiguous; send resume='auto' (continue the latest "
        "record, or start fresh when there is none) or a source such as resume='latest => latest'."
    )  # fmt: skip


def test_numbers_given_as_strings_are_numbers_in_arguments_and_overrides_alike(tmp_path):
    async def main():
        async with Client(build_server(tmp_path, max_jobs=0)) as client:
            job = await client.call_tool("nitro_train", {
                "experiment": "Regression", "seed": "7",
                "overrides": {"hidden": "16", "lr": "0.05", "max_epochs": 2.0, "samples": 256},
            })  # fmt: skip
            jobs = await client.call_tool("nitro_jobs", {"limit": "5"})
            bad_override = await client.call_tool("nitro_train", {"experiment": "Regression", "run_dir": "runs/other",
                                                                  "overrides": {"hidden": "16px"}})  # fmt: skip
            bad_argument = await client.call_tool(
                "nitro_train", {"experiment": "Regression", "seed": "7x"}
            )
            return job.structured_content, jobs, _text(bad_override), _text(bad_argument)

    job, jobs, bad_override, bad_argument = anyio.run(main)
    spec = _spec(tmp_path, job["job_id"])
    assert spec["seed"] == 7 and not jobs.is_error
    assert spec["overrides"] == {"hidden": 16, "lr": 0.05, "max_epochs": 2, "samples": 256}
    # a string that spells no number is refused, in the same words for an argument and an override
    assert bad_override == (
        "Error executing tool nitro_train: Regression: field 'hidden' expects int, got '16px' (str): Input should "
        "be a valid integer. Send overrides={\"hidden\": <int>} with a value that fits; nitro_experiments lists "
        "Regression's fields."
    )  # fmt: skip
    assert (
        bad_argument
        == "Error executing tool nitro_train: seed='7x' is not an integer; send e.g. seed=0."
    )


ARGUMENT_REFUSALS = [
    ("nitro_jobs", {"state": "done"},
     "state='done' is not one of 'queued', 'running', 'succeeded', 'failed', 'stopped', 'lost'; send e.g. "
     "state='queued'."),
    ("nitro_jobs", {"limit": "ten"}, "limit='ten' is not an integer; send e.g. limit=20."),
    ("nitro_stop", {"job_id": "x", "force": "maybe"},
     'force must be true or false (a JSON boolean), not the string "maybe": send {"force": true} or '
     '{"force": false} (Kill now, not after the epoch).'),
    ("nitro_status", {"job_id": "x", "wait_s": "soon"}, "wait_s='soon' is not a number; send e.g. wait_s=0."),
    ("nitro_train", {"experiment": "Regression", "overrides": "lr=0.1"},
     "overrides='lr=0.1' is not an object; send e.g. overrides={\"max_epochs\": 3}."),
    ("nitro_train", {"experiment": "Regression", "resume": 3},
     "resume=3 is not true or false or a string; send e.g. resume='false'."),
    ("nitro_manifest", {}, "run_dir is required; send e.g. run_dir='...'."),
]  # fmt: skip


@pytest.mark.parametrize(("tool", "args", "message"), ARGUMENT_REFUSALS)
def test_a_refused_argument_says_what_to_send(tmp_path, tool, args, message):
    async def main():
        async with Client(build_server(tmp_path, max_jobs=0)) as client:
            return await client.call_tool(tool, args)

    result = anyio.run(main)
    assert result.is_error and _text(result) == f"Error executing tool {tool}: {message}"


def _options_refusal(**kw):
    from nitro_core.training.options import check_options

    args = dict(resume=None, weights=None, restore_optimizer=False, restore_best=False,
                load_ema=False, strict=True)  # fmt: skip
    with pytest.raises(ConfigError) as exc:
        check_options(**{**args, **kw})
    return exc.value


LIBRARY_PHRASINGS = [  # (tool, the library's error, its text in Python, as the tool's refusal writes it)
    ("nitro_validate", lambda: _options_refusal(load_ema=True),
     "load_ema=True loads the EMA copy of the checkpoint weights= names; write Nitro(exp, weights='latest => best', "
     "load_ema=True). A resume restores the EMA as the EMA already.",
     "load_ema=true loads the EMA copy of the checkpoint weights= names; write nitro_validate(..., "
     "weights='latest => best', load_ema=true). A resume restores the EMA as the EMA already."),
    ("nitro_train", lambda: _options_refusal(restore_best=3),
     "restore_best=3: write True (the run's best checkpoint), False, or an average such as Average(Last(10)) or "
     "'Average(Last(10))'.",
     "restore_best=3: send restore_best=true (the run's best checkpoint), false, or an average such as "
     "'Average(Last(10))'."),
    ("nitro_validate",
     lambda: CheckpointNotFound("No checkpoint matches 'latest => best' in runs/reg: run a1b2c3d4 has no entry "
                                "scored by acc (max); it has loss (min) x4. Write ",
                                CheckpointerFix("metric='loss', mode='min'"), " or rank by acc in a new run."),
     "No checkpoint matches 'latest => best' in runs/reg: run a1b2c3d4 has no entry scored by acc (max); it has "
     "loss (min) x4. Write Checkpointer(metric='loss', mode='min') or rank by acc in a new run.",
     "No checkpoint matches 'latest => best' in runs/reg: run a1b2c3d4 has no entry scored by acc (max); it has "
     "loss (min) x4. Write Checkpointer(metric='loss', mode='min') returned by the experiment's checkpointer() (a "
     "change to its module) or rank by acc in a new run."),
    ("nitro_train",
     lambda: ResumeRefused("Strict resume refused: start a new run that takes only the weights: ", WEIGHTS_ONLY, "."),
     "Strict resume refused: start a new run that takes only the weights: Nitro(exp, weights=...).",
     "Strict resume refused: start a new run that takes only the weights: nitro_train(..., weights=...)."),
    ("nitro_train", lambda: _options_refusal(resume="auto", strict=False),
     "strict=False loads leaves by name, which cannot continue a run exactly. Drop strict=False to resume, or start "
     "a new run with weights=..., strict=False.",
     "strict=false loads leaves by name, which cannot continue a run exactly. Drop strict=false to resume, or start "
     "a new run with weights=..., strict=false."),
]  # fmt: skip


@pytest.mark.parametrize(("tool", "error", "python", "sent"), LIBRARY_PHRASINGS)
def test_the_library_s_python_advice_is_written_as_tool_arguments(tool, error, python, sent):
    from nitro_mcp.refusals import for_tool

    exc = error()
    assert (str(exc), for_tool(exc, tool)) == (python, sent)


def test_shrink_keeps_both_ends_of_a_long_list_and_says_what_it_left_out():
    from nitro_mcp.replies import shrink

    data = {"files": [f"f{i}" for i in range(300)], "note": "n" * 1000, "run": "a1"}
    assert shrink(data, 10_000) == data  # within the budget: untouched
    assert shrink(data, 700) == {
        "files": [*(f"f{i}" for i in range(10)), "… 280 more", *(f"f{i}" for i in range(290, 300))],
        "note": "n" * 400 + "… (1000 characters)", "run": "a1",
    }  # fmt: skip


def test_a_compact_reply_writes_a_nan_metric_as_null_in_text_and_structure():
    from nitro_mcp import models
    from nitro_mcp.replies import compact

    reply = compact(models.ValidateResult(job_id="j", state="succeeded", metrics={"acc": float("nan")}, split="val",
                                          checkpoint=None, averaged_from=None, error=None, next="Done."))  # fmt: skip
    assert reply.structured_content["metrics"] == {"acc": None}
    assert reply.content[0].text.startswith(
        '{"job_id":"j","state":"succeeded","metrics":{"acc":null},'
    )


def test_a_long_refusal_keeps_what_failed_and_what_to_send():
    from nitro_mcp.refusals import for_tool

    listing = "; ".join(
        f"{r:08x} (300 entries, epochs {', '.join(map(str, range(1, 301)))})" for r in range(10)
    )
    text = f"No run 'deadbeef' in 'runs/big'; it holds runs {listing}. Write one of those run ids."
    sent = for_tool(CheckpointNotFound(text), "nitro_validate")
    assert len(sent) < REPLY_MAX
    assert sent.startswith(
        "No run 'deadbeef' in 'runs/big'; it holds runs 00000000 (300 entries, epochs 1, 2,"
    )
    assert f" … ({len(text) - 5000} characters left out) … " in sent
    assert sent.endswith(", 299, 300). Write one of those run ids.")


def test_only_lists_of_objects_are_listed_as_arrays_of_objects():
    from pydantic import BaseModel, JsonValue, RootModel

    from nitro_mcp.replies import OutputListingSchema

    class Item(BaseModel):
        a: int

    class Reply(BaseModel):
        values: list[JsonValue]
        names: list[RootModel[str]]
        items: list[Item]
        maybe: list[Item] | None = None

    schema = Reply.model_json_schema(schema_generator=OutputListingSchema)
    assert schema["properties"] == {
        "values": {"items": {}, "type": "array"},  # [1, "x"] stays valid
        "names": {"items": {"type": "string"}, "type": "array"},
        "items": {"items": {"type": "object"}, "type": "array"},
        "maybe": {"items": {"type": "object"}, "type": ["array", "null"]},
    }
    assert "$defs" not in schema  # the object's definition went with its last reference
