"""The training family: ``nitro_train``, ``nitro_validate`` and ``average``.

Each takes its call model's fields flat (``TrainCall``, ``ValidateCall``, ``AverageCall``),
checks the whole call before a job exists (the experiment and its overrides, every source
against the manifest, the record's fit to the model, the executor and the machine), then
submits the call as it was checked. Validation and averaging wait up to ``wait_s`` for the
job's result.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context
from pydantic import Field, StrictBool

from nitro_core.errors import ConfigError, NitroError, parts_from_json
from nitro_core.jobs import JobStatus, groups, request_ids, slurm
from nitro_core.jobs.call_models import AverageCall, TrainCall, ValidateCall
from nitro_core.jobs.calls import arguments, train_arguments
from nitro_core.jobs.manager import new_job_id
from nitro_core.jobs.rank_launch import process_limit
from nitro_core.sources.grammar import Average, to_source
from nitro_core.store.place import ObjectPlace
from nitro_core.training.options import check_options
from nitro_mcp import call_checks, following, models, observe, seed_groups
from nitro_mcp.arguments import arguments_model, flag_text
from nitro_mcp.echo import clip
from nitro_mcp.gate import Gate, Progress, next_step
from nitro_mcp.paths import directory_inside_root, file_in_the_way, inside_root, shown
from nitro_mcp.record_fit import check_hf_fits, check_record_fits
from nitro_mcp.refusals import job_error
from nitro_mcp.replies import NitroServer, shrink
from nitro_mcp.tools.declare import call_of, off_loop, progress_of, tool, wait_parameter

AVERAGED_FROM_MAX = 2000  # characters of what an average was made of, in a reply

TrainArguments = arguments_model(
    "nitro_train",
    TrainCall,
    after_running=(StrictBool, Field(default=False, description="Queue behind a job training "
                   "run_dir (false: refuse).")),
    request_id=(str | None, Field(default=None, description="Retries with this id get its "
                "job.")),
    seeds=(list[int] | None, Field(default=None, description="A job per seed, as one group "
           "(run_dir/seed-<s>).")),
)  # fmt: skip
ValidateArguments = arguments_model(
    "nitro_validate", ValidateCall, wait_s=wait_parameter(60, "the metrics", 20)
)
AverageArguments = arguments_model(
    "average", AverageCall, wait_s=wait_parameter(60, "the result", 20)
)


def register(server: NitroServer, gate: Gate) -> None:
    @tool(server, "Start training as a background job; returns its job_id at once.", TrainArguments)  # fmt: skip
    async def nitro_train(arguments: Any, ctx: Context | None) -> models.JobHandle:
        call = call_of(TrainCall, arguments)
        return await off_loop(
            train, gate, call, arguments.after_running, arguments.request_id, arguments.seeds
        )

    @tool(server, "Evaluate a checkpoint on a split: its metrics within wait_s, else the "
          "job_id.", ValidateArguments)  # fmt: skip
    async def nitro_validate(arguments: Any, ctx: Context | None) -> models.ValidateResult:
        call = call_of(ValidateCall, arguments)
        return await validate(gate, call, arguments.wait_s, progress_of(ctx))

    @tool(server, "Average checkpoints of one run (float64, streamed); save or validate the "
          "average.", AverageArguments)  # fmt: skip
    async def average(arguments: Any, ctx: Context | None) -> models.AverageResult:
        call = call_of(AverageCall, arguments)
        return await average_call(gate, call, arguments.wait_s, progress_of(ctx))


# -- nitro_train -------------------------------------------------------------------------------
def train(
    gate: Gate,
    call: TrainCall,
    after_running: bool = False,
    request_id: str | None = None,
    seeds: list[int] | None = None,
) -> models.JobHandle:
    """Check a training call whole and submit it (queued behind a job training its run
    directory when ``after_running``); with ``seeds``, one job per seed as one group; with
    ``request_id``, a retry of a call that started a job (or a group) gets that job and
    starts nothing."""
    notes: list[str] = []
    if seeds is not None:
        seeds = groups.check_seeds(seeds)
        request = request_ids.call_digest(
            {**call.model_dump(mode="json"), "after_running": after_running, "seeds": seeds}
        )
        if request_id is None:
            group, duplicate = _start_group(gate, call, seeds, after_running), False
        else:  # the claim names the group: a retry finds it while any of its files stand
            group, duplicate = request_ids.once(
                gate.jobs.store_dir, request_id, request,
                lambda group_id: seed_groups.read(gate, group_id),
                lambda: _start_group(gate, call, seeds, after_running),
                id_of=lambda g: g.group,
            )  # fmt: skip
        note = (
            f"An earlier call with request_id={request_id!r} started this group; this one "
            "started nothing. " if duplicate else ""
        )  # fmt: skip
        return group_handle(gate, group, note).model_copy(update={"duplicate": duplicate})

    def start() -> JobStatus:
        status, behind = _submit_train(gate, call, after_running)
        notes.append(behind)
        return status

    if request_id is None:
        status, duplicate = start(), False
    else:
        digest = request_ids.call_digest(
            {**call.model_dump(mode="json"), "after_running": after_running}
        )
        status, duplicate = request_ids.once(
            gate.jobs.store_dir, request_id, digest, gate.jobs.status, start
        )
    if duplicate:
        notes.append(
            f"An earlier call with request_id={request_id!r} started this job; this one "
            "started nothing. "
        )
    handle = gate.handle(status, call.experiment, 2.0,
                         f"{''.join(notes)}Follow it with {following.follow_call(status.job_id)}.")  # fmt: skip
    return handle.model_copy(update={"duplicate": duplicate})


def _start_group(
    gate: Gate, call: TrainCall, seeds: list[int], after_running: bool
) -> groups.Group:
    """One job per seed, each training ``<run_dir>/seed-<s>``. Every seed's call is checked
    before anything is written; the group's file, naming every job, before the first job;
    a job that cannot be submitted stops those submitted before it."""
    if call.seed is not None:
        raise ConfigError(
            f"seed={clip(call.seed)} and seeds={clip(seeds)} both name seeds; send seeds=[...] "
            "for a group (one run per seed) or seed= for one run, not both."
        )
    resume = flag_text(call.resume, "resume")
    if resume not in ("false", "auto"):
        raise ConfigError(
            f"seeds={clip(seeds)} with resume={clip(resume)} would resume one record under every "
            "seed (a resume keeps its record's seed), so the group would have no spread. Send "
            f"weights={clip(resume)} to start each seed from that record, or resume='auto' to "
            "continue a group's own runs."
        )
    for seed in seeds:
        _check_seed(seed)
    if gate.storage_url(call.run_dir) is not None:
        raise ConfigError(
            f"seeds={clip(seeds)} trains each seed in a run directory of its own under "
            f"run_dir, on this machine's disk; run_dir={clip(call.run_dir)} is on object "
            "storage. Send a local run_dir with seeds, or train one seed there (no seeds)."
        )
    base = gate.run_dir(call.run_dir, call.experiment)
    checked = []
    for seed in seeds:
        where = shown(gate.root, groups.seed_dir(base, seed))
        try:
            checked.append(_checked_train(gate, call.model_copy(
                update={"seed": seed, "run_dir": where}), after_running))  # fmt: skip
        except NitroError as exc:
            raise type(exc)(
                f"seeds={clip(seeds)}: seed {seed}'s run ({where}) cannot start, so no seed "
                "started: ",
                *exc.parts,
            ) from None
    group = groups.new_group(
        groups.new_group_id(), call.experiment, base, seeds, [new_job_id() for _ in seeds]
    )
    groups.write_group(gate.jobs.store_dir, group)
    submitted: list[str] = []
    try:
        for job_id, (checked_call, after, _) in zip(group.jobs, checked, strict=True):
            gate.jobs.submit(checked_call, after=after, experiment_modules=gate.modules,
                             group=group.group, job_id=job_id)  # fmt: skip
            submitted.append(job_id)
    except BaseException:
        for job_id in reversed(submitted):  # no half group trains on
            with contextlib.suppress(NitroError):
                gate.jobs.stop(job_id, force=True)
        raise
    return group


def group_handle(gate: Gate, group: groups.Group, notes: str) -> models.JobHandle:
    brief = seed_groups.brief(gate, group)
    return models.JobHandle(
        job_id=group.group, kind="train", state=brief.state, experiment=group.experiment,
        run_dir=shown(gate.root, group.run_dir), poll_after_s=2.0, group=brief,
        next=f"{notes}Follow the group with {following.follow_call(group.group)}; when it ends, "
        f"nitro_compare(group={group.group!r}) gives each metric's mean and spread.",
    )  # fmt: skip


def _submit_train(gate: Gate, call: TrainCall, after_running: bool) -> tuple[JobStatus, str]:
    """The checked call's job, and the sentence saying what it waits for (or nothing)."""
    checked, after, behind = _checked_train(gate, call, after_running)
    return gate.jobs.submit(checked, after=after, experiment_modules=gate.modules), behind


def _checked_train(
    gate: Gate, call: TrainCall, after_running: bool
) -> tuple[TrainCall, str | None, str]:
    """The call as checked (its paths resolved, its executor filled in), the job it queues
    behind (or None), and the sentence saying so (or nothing)."""
    from nitro_core.training.plan import plan  # lazy: torch

    resume = flag_text(call.resume, "resume")
    restore_best = flag_text(call.restore_best, "restore_best")
    experiment, overrides, weights = call.experiment, call.overrides, call.weights
    cls = gate.experiment_class(experiment, overrides)

    def shapes(exp: Any) -> dict[str, list[int]] | None:
        return gate.shapes(experiment, exp)

    store = gate.run_store(call.run_dir, experiment)  # on object storage: under --storage
    place = str(store)  # the job's run_dir: a path, or a URL
    observe.check_logger_name(call.logger)  # tensorboard installed here
    call = call.model_copy(
        update={"run_dir": place, "resume": resume, "restore_best": restore_best}
    )
    args = train_arguments(**{**call.model_dump(), "run_dir": shown(gate.root, place)})
    store.check_writable()  # a directory the job creates and writes in, refused now if it cannot
    call_checks.check_tracker_credentials(call.logger, args, gate.root)  # where jobs run
    busy = call_checks.busy_job(gate.jobs, place)
    if busy is not None and not after_running:
        raise call_checks.refuse_busy(busy, args)

    def rooted(source: Any) -> Any:  # confined under the root, or under the storage
        return gate.rooted_in(source, store, "resume")

    # the pre-flight the handle starts from too: options, seed, device, budget, the manifest
    # and the resumed record's header (on object storage by ranged reads), nothing built
    planned = plan(
        store, resume=resume, weights=weights, restore_optimizer=call.restore_optimizer,
        restore_best=restore_best, strict=call.strict, seed=call.seed, device=call.device,
        max_steps=call.max_steps, time_limit=call.time_limit, rooted=rooted,
    )  # fmt: skip
    opts, point = planned.options, planned.point
    if point is None:
        exp = cls(**overrides)  # unknown or ill-typed fields raise ConfigError
    else:  # the recorded config, overrides changing Host fields only
        # queued behind a job, the run may have trained on by its start: its worker checks
        exp = call_checks.resume_experiment(
            cls, point, overrides, args, busy is None, gate.registry, shapes
        )
        point.check_config(exp)
    average = str(opts.restore_best) if isinstance(opts.restore_best, Average) else None
    hooks = gate.ask(experiment, exp, "logger", keep_for=average) if point or average else {}
    observe.check_logger(call.logger, point, exp, args, hooks.get("logger"))
    if opts.weights is not None:
        found = gate.check_source(opts.weights, place, "weights")  # a path, or a URL
        if opts.weights.hf_directory() is not None:  # its shards' headers name its tensors
            assert isinstance(found, Path)  # hf: names a local directory
            check_hf_fits(exp, found, call.strict, str(weights), "nitro_train", args, shapes)
        else:
            check_record_fits(
                exp, found, call.strict, gate.named(found), "nitro_train", args, gate.registry,
                shapes,
            )  # fmt: skip
    if hooks.get("keep"):  # checkpointer()'s keep cannot hold the restore_best average
        raise ConfigError(*parts_from_json(hooks["keep"]))
    call = _with_executor(gate, call)
    if call.executor == "slurm":  # the cluster's nodes, not this machine, bound it
        slurm.check_submittable(call)
    else:
        _check_process_limit(call.nproc, call.device)
    after = busy.job_id if busy is not None else None
    return call, after, f"It starts when job {busy.job_id} ends. " if busy is not None else ""


def _with_executor(gate: Gate, call: TrainCall) -> TrainCall:
    """The call with the server's default executor and Slurm options filled in; a
    cluster-only option on a local call is refused."""
    executor = call.executor or gate.executor
    if executor == "local" and (call.nodes > 1 or call.slurm is not None):
        raise ConfigError(
            f"{'nodes=' + str(call.nodes) if call.nodes > 1 else 'slurm='} runs on a "
            "cluster: send executor='slurm' with it (nitro serve --executor slurm makes it "
            "the default), or leave it out to train on this machine."
        )
    if executor == "local":  # as sent: a local job's spec and hints name no executor
        return call
    options = call.slurm if call.slurm is not None else gate.slurm_options
    return call.model_copy(update={"executor": executor, "slurm": options})


def _check_seed(seed: int | None) -> None:
    from nitro_core.training.setup import check_seed  # lazy: wiring imports torch

    check_seed(seed)


def _check_process_limit(nproc: int, device: str) -> None:
    """Refuse more ranks than the machine runs side by side (one per GPU, or per CPU)."""
    if nproc == 1:
        return
    limit, what = process_limit(device)
    if nproc > limit:
        raise ConfigError(
            f"nproc={nproc} is more processes than this machine has room for: {what}. Send "
            f"nproc from 1 to {max(limit, 1)}, e.g. nproc={max(limit, 1)}."
        )


# -- nitro_validate ------------------------------------------------------------------------------
async def validate(
    gate: Gate, call: ValidateCall, wait_s: float, progress: Progress | None
) -> models.ValidateResult:
    status, notes = await anyio.to_thread.run_sync(lambda: _submit_validate(gate, call))
    status = await gate.wait(status.job_id, wait_s, progress)
    result = status.result or {}
    return models.ValidateResult(
        job_id=status.job_id, state=status.state, metrics=result.get("metrics"), split=call.split,
        checkpoint=shown(gate.root, result.get("checkpoint")),
        averaged_from=shrink(result.get("averaged_from"), AVERAGED_FROM_MAX),
        error=job_error(status), next=next_step(status, gate.hint(status)),
        warnings=call_checks.warnings_of(notes, result),
    )  # fmt: skip


def _submit_validate(gate: Gate, call: ValidateCall) -> tuple[JobStatus, list[str]]:
    experiment, overrides = call.experiment, call.overrides
    cls = gate.experiment_class(experiment, overrides)
    store = gate.run_store(call.run_dir, experiment)  # on object storage: under --storage
    opts = check_options(False, call.weights, False, False, call.load_ema, True)
    assert opts.weights is not None  # weights is a string, so it became a source
    rooted = gate.rooted_in(opts.weights, store, "weights")
    # its config, from the record's header (on object storage by ranged reads)
    exp, notes, path = call_checks.from_record(cls, rooted, store, overrides)
    named = gate.named(path)
    call = call.model_copy(update={"run_dir": str(store)})
    args = arguments(ValidateCall, {**call.model_dump(), "run_dir": shown(gate.root, str(store))})
    check_record_fits(exp, path, True, named, "nitro_validate", args, gate.registry,
                      lambda e: gate.shapes(experiment, e), call.load_ema)  # fmt: skip
    gate.check_split(experiment, call.split)
    return gate.jobs.submit(call, experiment_modules=gate.modules), notes


# -- average ---------------------------------------------------------------------------------------
async def average_call(
    gate: Gate, call: AverageCall, wait_s: float, progress: Progress | None
) -> models.AverageResult:
    status, notes = await anyio.to_thread.run_sync(lambda: _submit_average(gate, call))
    status = await gate.wait(status.job_id, wait_s, progress)
    result = status.result or {}
    return models.AverageResult(
        job_id=status.job_id, state=status.state,
        averaged_from=shrink(result.get("averaged_from"), AVERAGED_FROM_MAX),
        saved=shown(gate.root, result.get("saved")), metrics=result.get("metrics"), error=job_error(status),
        next=next_step(status, gate.hint(status)), warnings=call_checks.warnings_of(notes, result),
    )  # fmt: skip


def _submit_average(gate: Gate, call: AverageCall) -> tuple[JobStatus, list[str]]:
    checked, notes = checked_average(gate, call)
    return gate.jobs.submit(checked, experiment_modules=gate.modules), notes


def checked_average(gate: Gate, call: AverageCall) -> tuple[AverageCall, list[str]]:
    """``call`` checked as ``average`` checks it, with its paths under the root and the
    experiment it is validated in; and the notes for the reply."""
    run_dir, source, save, experiment = call.run_dir, call.source, call.save, call.experiment
    overrides, split = call.overrides, call.split
    url = gate.storage_url(run_dir)
    where: Path | str = str(url) if url else directory_inside_root(gate.root, run_dir, "run_dir")
    src = to_source(source, "source")
    if src.averaged() is None:
        raise ConfigError(
            f"source={clip(source)} is not an average; write e.g. source='latest => Average(Last(10))'."
        )
    saved: Path | str | None = None
    if save is not None and (save_url := gate.storage_url(save, "save")) is not None:
        ObjectPlace(save_url).refuse_taken("save=")  # a new object under the storage
        saved = str(save_url)
    elif save is not None:
        saved = local = inside_root(gate.root, save, "save")
        if local.suffix != ".safetensors":
            raise ConfigError(
                f"save={clip(save)} must name a .safetensors file, e.g. save='runs/Classifier/avg10.safetensors'."
            )
        blocker = file_in_the_way(local.parent)
        if blocker is not None:
            raise ConfigError(
                f"save={clip(save)} lies under the file {clip(shown(gate.root, blocker))}, not a "
                "directory; give a path in a directory, e.g. save='runs/Classifier/avg10.safetensors'."
            )
        if local.exists():
            raise ConfigError(
                f"save={clip(save)} already exists; Nitro never overwrites it. Choose a new name."
            )
    notes: list[str] = []
    if not call.validate_average:
        gate.check_source(src, where, "source")
        call_checks.refuse_unused(run_dir, source, overrides, split)
    else:  # the state record's config, the call's overrides on top
        experiment = call_checks.average_experiment(experiment, src, where, gate.registry, run_dir)
        cls = gate.experiment_class(experiment, overrides)
        exp, notes, path = call_checks.from_record(cls, src, where, overrides)
        args: dict[str, Any] = {
            "run_dir": run_dir,
            "source": source,
            "validate": True,
            "experiment": experiment,
        }
        args.update({"overrides": overrides} if overrides else {})
        args.update({"split": split} if split != "val" else {})
        check_record_fits(exp, path, True, gate.named(path), "average", args, gate.registry,
                          lambda e: gate.shapes(experiment, e))  # fmt: skip
        gate.check_split(experiment, split)
    call = call.model_copy(
        update={"run_dir": str(where), "save": str(saved) if saved else None,
                "experiment": experiment}
    )  # fmt: skip
    return call, notes
