"""``nitro train``, ``nitro validate`` and ``nitro average``: the training family, run in
this process.

Each builds its call model from the options (``TrainCall``, ``ValidateCall``,
``AverageCall``: one option per field, so a new field of the call is a new option) and runs
it through the library as a job's worker does. ``train`` prints one JSON line per epoch on
stdout and its closing sentence on stderr; ``--nproc N`` relaunches the command on N ranks
through torch's own launcher.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import UnionType
from typing import Any, Literal, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

from nitro_core.jobs.call_models import AverageCall, TrainCall, ValidateCall
from nitro_mcp.cli.common import (
    OK,
    REFUSED,
    Handler,
    absolute,
    command,
    emit,
    gate,
    root_option,
    run_place,
    say,
)
from nitro_mcp.paths import shown

C = TypeVar("C", bound=BaseModel)


def add(sub: Any) -> dict[str, Handler]:
    train = command(sub, "train", "train an experiment in this process",
                    "nitro train Classifier --set max_epochs=3")  # fmt: skip
    experiment_args(train)
    _call_args(train, TrainCall, skip=("experiment", "run_dir", "overrides"))

    validate = command(sub, "validate", "evaluate a checkpoint on a split and print its metrics",
                       'nitro validate Classifier --weights "latest => best"')  # fmt: skip
    experiment_args(validate)
    _call_args(validate, ValidateCall, skip=("experiment", "run_dir", "overrides"))

    average = command(sub, "average", "average checkpoints of a run, optionally saving the result",
                      'nitro average runs/Classifier --source "latest => Average(Last(3))" --save avg.safetensors')  # fmt: skip
    average.add_argument("run_dir", help="the run directory, e.g. runs/Classifier")
    _call_args(average, AverageCall, skip=("run_dir", "overrides"))
    average.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                         help="with --validate: a config field over the record's (JSON value)")  # fmt: skip
    average.add_argument("--experiment-module", action="append", default=[], metavar="MODULE",
                         help="also register the Experiment subclasses of MODULE")  # fmt: skip
    root_option(average)
    return {"train": _train, "validate": _validate, "average": _average}


def experiment_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", help="a registered experiment name, e.g. Classifier")
    p.add_argument("--run-dir", help="the run directory (default: runs/<experiment>)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field (JSON value)")  # fmt: skip
    p.add_argument("--experiment-module", action="append", default=[], metavar="MODULE",
                   help="also register the Experiment subclasses of MODULE (a dotted module or a .py file)")  # fmt: skip


def _call_args(p: argparse.ArgumentParser, model: type[BaseModel], skip: tuple[str, ...]) -> None:
    """One option per field of the call ``model`` (but ``skip``): ``--restore-best`` for
    ``restore_best``, its choices from a ``Literal``, its help from the field's description,
    so a new field of the call is a new option here too."""
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        word = info.alias or name  # the name a call writes: average's validate
        flag, default = f"--{word.replace('_', '-')}", info.get_default(call_default_factory=True)
        helps = f"{(info.description or '').replace('%', '%%')} (default: %(default)s)"
        ann = info.annotation
        union = get_args(ann) if isinstance(ann, UnionType) else (ann,)
        arms = [a for a in union if a is not type(None)]
        literal = next((get_args(a) for a in arms if get_origin(a) is Literal), None)
        if arms == [bool]:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=helps)
        elif literal is not None:
            p.add_argument(flag, choices=literal, default=default, help=helps)
        else:
            kind = int if int in arms and str not in arms else str
            p.add_argument(flag, type=kind, default=default, help=helps)


def _call(model: type[C], args: argparse.Namespace, **fields: Any) -> C:
    """The call ``model`` the parsed options spell (with ``fields`` for those parsed apart)."""
    words = {info.alias or name for name, info in model.model_fields.items()}
    given = {k: v for k, v in vars(args).items() if k in words}
    return model.model_validate({**given, **fields})


def _experiment(args: argparse.Namespace, from_record: Any = None, name: str | None = None) -> Any:
    """The named experiment (``name``, else ``args.experiment``) with ``--set`` overrides on
    top of its defaults, or on top of the config recorded in ``from_record``'s record (a
    source, as validation uses)."""
    from nitro_core import experiment_from_record  # lazy
    from nitro_core.registry import load_registry, lookup  # lazy

    overrides = _overrides(args.set)
    cls = lookup(load_registry(args.experiment_module), name or args.experiment)
    if from_record is not None:
        run_dir = args.run_dir or f"runs/{cls.__name__}"
        return experiment_from_record(cls, from_record, run_dir=run_dir, **overrides)
    return cls(**overrides)


def _overrides(items: list[str]) -> dict[str, Any]:
    """``--set FIELD=VALUE`` options as config overrides (a value that is not JSON, a string)."""
    overrides: dict[str, Any] = {}
    for item in items:
        field, _, value = item.partition("=")
        try:
            overrides[field] = json.loads(value)
        except json.JSONDecodeError:
            overrides[field] = value
    return overrides


def train_call(args: argparse.Namespace) -> TrainCall:
    """The one ``TrainCall`` that ``nitro train``'s options spell, whichever executor runs
    it: in this process, on ``--nproc`` ranks or submitted to Slurm (``--set`` overrides
    included: they are the call's ``overrides``, as the tool's and the API's)."""
    slurm = json.loads(args.slurm) if isinstance(args.slurm, str) else args.slurm
    return _call(TrainCall, args, experiment=args.experiment, run_dir=args.run_dir,
                 overrides=_overrides(args.set), slurm=slurm)  # fmt: skip


def _train(args: argparse.Namespace) -> int:
    from nitro_core import Nitro  # lazy
    from nitro_core.registry import load_registry, lookup  # lazy

    try:
        call = train_call(args)
    except json.JSONDecodeError as exc:
        say(f"nitro train: --slurm {args.slurm!r} is not JSON ({exc.msg}); write e.g. "
            """--slurm '{"partition": "debug"}'.""")  # fmt: skip
        return REFUSED
    except ValidationError as exc:
        say(f"nitro train: {cli_errors(exc)}")
        return REFUSED
    if call.executor == "slurm":  # submitted to the cluster and followed from here
        from nitro_mcp.cluster_cli import train_on_cluster  # lazy: the gate imports torch

        return train_on_cluster(call, args)
    if call.nproc > 1 and "RANK" not in os.environ:  # no more ranks than GPUs, or than CPUs
        from nitro_core.jobs.rank_launch import process_limit  # lazy: it imports torch

        limit, what = process_limit("auto")
        if call.nproc > limit:
            say(f"nitro train: --nproc {call.nproc} is more processes than this machine has "
                f"room for: {what}; e.g. --nproc {limit}.")  # fmt: skip
            return REFUSED
        return _launch_ranks(call.nproc, args.argv)  # launch the ranks, each running this

    cls = lookup(load_registry(args.experiment_module), call.experiment)
    n = Nitro(cls(**call.overrides), **call.nitro_kwargs())
    main_rank = int(os.environ.get("RANK", "0")) == 0  # rank 0 prints for the job

    def on_epoch(row: dict[str, Any]) -> None:
        if main_rank:
            print(json.dumps({k: row[k] for k in ("epoch", "step", "train_loss", "val")}))

    n.train(on_epoch=on_epoch)
    if main_rank:  # prose for the person: stdout carries only the JSON lines
        say(f"run {n.run_id} in {n.store}: {n.stop_reason} at epoch {n.epoch}")
    n.close()
    return OK


def cli_errors(exc: ValidationError) -> str:
    """A refused option in the terminal's words: ``--nproc 0 is not 1 to 64; e.g. --nproc 2.``"""
    parts = []
    for err in exc.errors():
        flag = f"--{str(err['loc'][0]).replace('_', '-')}" if err["loc"] else "the options"
        bounds = _bounds(err["loc"])
        if err["type"] == "value_error" and "error" in err.get("ctx", {}):  # says it whole
            parts.append(f"{flag}: {err['ctx']['error']}")
        elif err["type"] == "extra_forbidden" and len(err["loc"]) > 1:  # a typo inside --slurm
            takes = ", ".join(_nested_fields(str(err["loc"][0])))
            parts.append(f"{flag}: unknown option {str(err['loc'][-1])!r}; it takes: {takes}.")
        elif err["type"] in ("greater_than_equal", "less_than_equal") and len(bounds) == 2:
            low, high = bounds
            parts.append(f"{flag} {err['input']} is not {low} to {high}; e.g. {flag} {low + 1}.")
        else:
            parts.append(f"{flag} {err['input']!r}: {err['msg']}.")
    return " ".join(parts)


def _nested_fields(name: str) -> list[str]:
    """The fields of the model a call field takes (``slurm``: ``SlurmOptions``'s)."""
    info = TrainCall.model_fields.get(name)
    ann = info.annotation if info else None
    arms = get_args(ann) if isinstance(ann, UnionType) else (ann,)
    model = next((a for a in arms if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return list(model.model_fields) if model is not None else []


def _bounds(loc: tuple[Any, ...]) -> list[Any]:
    info = TrainCall.model_fields.get(str(loc[0])) if loc else None
    found = {type(m).__name__: m for m in (info.metadata if info else [])}
    return [found["Ge"].ge, found["Le"].le] if {"Ge", "Le"} <= set(found) else []


def _launch_ranks(nproc: int, argv: list[str]) -> int:
    """``nitro train ... --nproc N``: the same command on N processes, through torch's own
    launcher (each rank sees torchrun's environment and joins the group)."""
    # the ranks need no --nproc (and torchrun's own parser would take it for --nproc-per-node)
    rest, skip = [], False
    for a in argv:
        if skip or a.startswith("--nproc="):
            skip = False
            continue
        skip = a == "--nproc"
        if not skip:
            rest.append(a)
    command_ = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}", "-m", "nitro_mcp.cli", *rest,
    ]  # fmt: skip
    return subprocess.run(command_, check=False).returncode


def _validate(args: argparse.Namespace) -> int:
    from nitro_core import Nitro  # lazy

    call = _call(ValidateCall, args)
    exp = _experiment(args, from_record=call.weights)  # the record's own config, --set on top
    n = Nitro(exp, **call.nitro_kwargs())
    metrics = n.evaluate(call.split)
    result = {"checkpoint": str(n.checkpoint_source), "split": call.split, "metrics": metrics}
    emit(args, result, lambda: [
        f"checkpoint: {result['checkpoint']}", f"split: {call.split}",
        *(f"  {k}: {v:.6g}" if isinstance(v, float) else f"  {k}: {v}" for k, v in metrics.items()),
    ])  # fmt: skip
    return OK


def _average(args: argparse.Namespace) -> int:
    """What ``average`` does, in this process: the tool's checks, then its job's work."""
    run_dir = run_place(args.run_dir)  # a directory, or s3://...
    from nitro_core.jobs.worker import average_job  # lazy: torch
    from nitro_mcp.tools.training_tools import checked_average  # lazy: the gate imports torch

    save = None if args.save is None else absolute(args.save, "save")
    g = gate(args, run_dir, save)
    asked = _call(AverageCall, args, run_dir=run_dir, save=save, overrides=_overrides(args.set))
    call, notes = checked_average(g, asked)
    for note in notes:
        say(f"warning: {note}")
    with tempfile.TemporaryDirectory(prefix="nitro-average-") as scratch:
        result = average_job(
            call,
            lambda record: _experiment(args, from_record=record, name=call.experiment),
            Path(scratch) / "average.safetensors",
        )  # fmt: skip
    if result["saved"] is not None:
        result["saved"] = shown(g.root, result["saved"])
    emit(args, result, lambda: [
        *(f"{k}: {v}" for k, v in result["averaged_from"].items()),
        f"saved: {result['saved'] or '-'}",
        *(f"  {k}: {v:.6g}" if isinstance(v, float) else f"  {k}: {v}"
          for k, v in (result.get("metrics") or {}).items()),
    ])  # fmt: skip
    return OK


__all__ = ["add", "cli_errors", "experiment_args", "train_call"]
