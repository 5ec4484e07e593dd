"""The ``nitro`` command.

``nitro serve`` runs the MCP server (stdio, or ``--http`` on 127.0.0.1 with a bearer token);
``nitro demo`` drives it as an agent would; ``train``, ``validate``, ``average``, ``runs``,
``manifest``, ``info`` and ``verify`` are for people at a terminal; ``schemas`` regenerates schemas/.
This is an edge of the program, so it prints; the libraries it calls never do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import UnionType
from typing import Any, Literal, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

from nitro_core._version import __version__
from nitro_core.errors import ConfigError, NitroError
from nitro_core.jobs.call_models import AverageCall, SlurmOptions, TrainCall, ValidateCall

C = TypeVar("C", bound=BaseModel)

_BULKY: tuple[str, ...] = ("rng", "optimizer", "history", "layout", "scheduler", "plateau")
_BULKY += ("logger", "position", "data")  # position, data: a mid-epoch record's place


# One example per command, shown under its --help (tests/nitro_mcp/test_cli_help.py parses each
# and fails for a command that has none: a new command adds its line here).
EXAMPLES = {
    "serve": "nitro serve --root . --experiment-module experiments.py",
    "demo": "nitro demo --epochs 3",
    "train": "nitro train Classifier --set max_epochs=3",
    "validate": 'nitro validate Classifier --weights "latest => best"',
    "average": 'nitro average runs/Classifier --source "latest => Average(Last(3))" --save avg.safetensors',
    "runs": "nitro runs runs/Classifier",
    "manifest": "nitro manifest runs/Classifier",
    "info": "nitro info runs/Classifier/epoch-0003-step-36-acc=0.8125.safetensors",
    "verify": "nitro verify runs/Classifier",
    "export": 'nitro export "latest => Average(Last(3))" exports/model-hf --run-dir runs/HFCausalLM --format hf',
    "schemas": "nitro schemas --out schemas",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nitro",
        description="Nitro: trustworthy PyTorch checkpoints, and an MCP server for agents.",
        epilog="example:\n  nitro demo\n\n`nitro COMMAND --help` says what a command does, with an example.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"nitro {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the MCP server that agents launch (stdio by default)")
    serve.add_argument(
        "--root", default=".", help="every path resolves inside this directory (default: .)"
    )
    serve.add_argument(
        "--http", action="store_true", help="serve streamable HTTP on 127.0.0.1 instead of stdio"
    )
    serve.add_argument("--port", type=int, default=8765, help="HTTP port (default: %(default)s)")
    serve.add_argument(
        "--token", help="bearer token for --http (default: generated and printed to stderr)"
    )
    serve.add_argument(
        "--max-jobs",
        type=int,
        default=2,
        help="jobs running at once; later ones queue (default: 2)",
    )
    serve.add_argument(
        "--max-eval-jobs",
        type=int,
        default=2,
        help="validations and averages running at once, beside --max-jobs trainings (default: 2)",
    )
    serve.add_argument("--experiment-module", action="append", default=[], metavar="MODULE",
                       help="register the Experiment subclasses of MODULE: a dotted module importable "
                       "from the root, or a .py file inside it (repeatable; re-imported when edited)")  # fmt: skip
    serve.add_argument("--import-timeout", type=float, default=30.0, metavar="SECONDS",
                       help="the longest an --experiment-module may take to import before it is "
                       "listed as failed (default: %(default)s)")  # fmt: skip

    serve.add_argument("--executor", choices=("local", "slurm"), default="local",
                       help="what runs a nitro_train that names none: worker processes here, "
                       "or sbatch on a Slurm cluster (default: %(default)s)")  # fmt: skip
    serve.add_argument("--slurm-partition", help="with --executor slurm: the default partition")
    serve.add_argument("--slurm-account", help="with --executor slurm: the default account")

    demo = sub.add_parser("demo", help="start the server and drive it over stdio as an agent would")
    demo.add_argument("--root", default=".", help="where runs/ and .nitro/ go (default: .)")
    demo.add_argument(
        "--epochs", type=int, default=6, help="epochs to train (default: %(default)s)"
    )

    train = sub.add_parser("train", help="train an experiment in this process")
    _experiment_args(train)
    _call_args(train, TrainCall, skip=("experiment", "run_dir", "overrides"))

    validate = sub.add_parser(
        "validate", help="evaluate a checkpoint on a split and print its metrics"
    )
    _experiment_args(validate)
    validate.add_argument(
        "--weights", default="latest => best", help="a source (default: %(default)s)"
    )
    validate.add_argument(
        "--split", default="val", help="the split to evaluate (default: %(default)s)"
    )
    validate.add_argument(
        "--load-ema", action="store_true", help="evaluate the record's EMA weights"
    )

    average = sub.add_parser(
        "average", help="average checkpoints of a run, optionally saving the result"
    )
    average.add_argument("run_dir", help="the run directory, e.g. runs/Classifier")
    average.add_argument(
        "--source",
        default="latest => Average(Last(10))",
        help="what to average (default: %(default)s)",
    )
    average.add_argument("--save", help="write the average as a record here")

    runs_p = sub.add_parser("runs", help="list the runs and checkpoints a run directory holds")
    runs_p.add_argument("run_dir", help="the run directory, e.g. runs/Classifier")
    man = sub.add_parser("manifest", help="print a run directory's manifest as JSON")
    man.add_argument("run_dir", help="the run directory, e.g. runs/Classifier")
    info = sub.add_parser("info", help="show a record's header without loading its tensors")
    info.add_argument("file", help="a .safetensors record")
    info.add_argument(
        "--full", action="store_true", help="include RNG, optimizer, layout and history"
    )
    export = sub.add_parser(
        "export", help="write a checkpoint's weights to a file, or an HF directory"
    )
    export.add_argument("source", help="'latest => best', another source, or a record's path")
    export.add_argument("out", help="a new .safetensors file, or with --format hf a new directory")
    export.add_argument("--run-dir", help="the source's run directory, e.g. runs/Classifier")
    export.add_argument("--format", choices=("weights", "hf"), default="weights",
                        help="hf: config.json and model.safetensors (default: %(default)s)")  # fmt: skip
    export.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                        help="--format hf: cast floating weights to this dtype")  # fmt: skip
    export.add_argument("--max-shard-size", default="5GB",
                        help="--format hf: the largest shard (default: %(default)s)")  # fmt: skip
    verify = sub.add_parser(
        "verify", help="check every byte of a record, or of a run directory's records"
    )
    verify.add_argument("path", help="a .safetensors record or a run directory")
    schemas = sub.add_parser("schemas", help="regenerate the JSON Schemas under schemas/")
    schemas.add_argument("--out", default="schemas", help="where to write (default: %(default)s)")
    _describe(sub)
    return parser


def _describe(sub: Any) -> None:
    """Give each command's --help its one-line summary (the help shown in `nitro --help`) and
    its example from EXAMPLES."""
    summaries = {action.dest: action.help for action in sub._choices_actions}
    for name, command in sub.choices.items():
        command.description = summaries.get(name)
        command.formatter_class = argparse.RawDescriptionHelpFormatter
        if name in EXAMPLES:
            command.epilog = f"example:\n  {EXAMPLES[name]}"


def _call_args(p: argparse.ArgumentParser, model: type[BaseModel], skip: tuple[str, ...]) -> None:
    """One option per field of the call ``model`` (but ``skip``): ``--restore-best`` for
    ``restore_best``, its choices from a ``Literal``, its help from the field's description,
    so a new field of the call is a new option here too."""
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        flag, default = f"--{name.replace('_', '-')}", info.get_default(call_default_factory=True)
        helps = f"{(info.description or '').replace('%', '%%')} (default: %(default)s)"
        ann = info.annotation
        arms = [
            a
            for a in (get_args(ann) if isinstance(ann, UnionType) else (ann,))
            if a is not type(None)
        ]
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
    given = {k: v for k, v in vars(args).items() if k in model.model_fields}
    return model.model_validate({**given, **fields})


def _experiment_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", help="a registered experiment name, e.g. Classifier")
    p.add_argument("--run-dir", help="the run directory (default: runs/<experiment>)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field (JSON value)",
    )
    p.add_argument("--experiment-module", action="append", default=[], metavar="MODULE",
                   help="also register the Experiment subclasses of MODULE (a dotted module or a .py file)")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `train --nproc` relaunches it
    try:
        return _COMMANDS[args.command](args)
    except (NitroError, FileNotFoundError) as exc:
        print(f"nitro {args.command}: {exc}", file=sys.stderr)
        return 1


def _serve(args: argparse.Namespace) -> int:
    from nitro_mcp.serve import serve_http, serve_stdio  # lazy
    from nitro_mcp.server import build_server  # lazy

    server = build_server(
        Path(args.root), max_jobs=args.max_jobs, experiment_modules=tuple(args.experiment_module),
        max_eval_jobs=args.max_eval_jobs, import_timeout_s=args.import_timeout,
        executor=args.executor, slurm_options=_slurm_options(args),
    )  # fmt: skip
    if args.http:
        serve_http(server, args.port, args.token)
    else:
        serve_stdio(server)
    return 0


def _slurm_options(args: argparse.Namespace) -> SlurmOptions | None:
    """``--slurm-partition`` and ``--slurm-account`` as a call's default Slurm options."""
    if args.slurm_partition is None and args.slurm_account is None:
        return None
    return SlurmOptions(partition=args.slurm_partition, account=args.slurm_account)


def _demo(args: argparse.Namespace) -> int:
    from nitro_mcp.demo import main as demo_main  # lazy

    return demo_main(Path(args.root).resolve(), args.epochs)


def _experiment(args: argparse.Namespace, from_record: Any = None) -> Any:
    """The named experiment with ``--set`` overrides on top of its defaults, or on top of
    the config recorded in ``from_record``'s record (a source, as validation uses)."""
    from nitro_core import experiment_from_record  # lazy
    from nitro_core.registry import load_registry, lookup  # lazy

    overrides = {}
    for item in args.set:
        field, _, value = item.partition("=")
        try:
            overrides[field] = json.loads(value)
        except json.JSONDecodeError:
            overrides[field] = value
    cls = lookup(load_registry(args.experiment_module), args.experiment)
    if from_record is not None:
        run_dir = args.run_dir or f"runs/{cls.__name__}"
        return experiment_from_record(cls, from_record, run_dir=run_dir, **overrides)
    return cls(**overrides)


def _train(args: argparse.Namespace) -> int:
    from nitro_core import Nitro  # lazy

    try:
        slurm = json.loads(args.slurm) if isinstance(args.slurm, str) else args.slurm
        call = _call(TrainCall, args, experiment=args.experiment, run_dir=args.run_dir, slurm=slurm)
    except json.JSONDecodeError as exc:
        print(f"nitro train: --slurm {args.slurm!r} is not JSON ({exc.msg}); write e.g. "
              """--slurm '{"partition": "debug"}'.""", file=sys.stderr)  # fmt: skip
        return 2
    except ValidationError as exc:
        print(f"nitro train: {_cli_errors(exc)}", file=sys.stderr)
        return 2
    if call.executor == "slurm":  # submitted to the cluster and followed from here
        from nitro_mcp.cluster_cli import train_on_cluster  # lazy: the gate imports torch

        return train_on_cluster(call, args)
    if call.nproc > 1 and "RANK" not in os.environ:  # no more ranks than GPUs, or than CPUs
        from nitro_core.jobs.ranks import process_limit  # lazy: it imports torch

        limit, what = process_limit("auto")
        if call.nproc > limit:
            print(f"nitro train: --nproc {call.nproc} is more processes than this machine has "
                  f"room for: {what}; e.g. --nproc {limit}.", file=sys.stderr)  # fmt: skip
            return 2
    if call.nproc > 1 and "RANK" not in os.environ:  # launch the ranks, each running this
        return _launch_ranks(call.nproc, args.argv)

    n = Nitro(_experiment(args), **call.nitro_kwargs())
    main_rank = int(os.environ.get("RANK", "0")) == 0  # rank 0 prints for the job

    def on_epoch(row: dict[str, Any]) -> None:
        if main_rank:
            print(json.dumps({k: row[k] for k in ("epoch", "step", "train_loss", "val")}))

    n.train(on_epoch=on_epoch)
    if main_rank:  # prose for the person: stdout carries only the JSON lines
        print(f"run {n.run_id} in {n.run_dir}: {n.stop_reason} at epoch {n.epoch}", file=sys.stderr)
    n.close()
    return 0


def _cli_errors(exc: ValidationError) -> str:
    """A refused option in the terminal's words: ``--nproc 0 is not 1 to 64; e.g. --nproc 2.``"""
    parts = []
    for err in exc.errors():
        flag = f"--{str(err['loc'][0]).replace('_', '-')}" if err["loc"] else "the options"
        bounds = [m for m in _bounds(err["loc"])]
        if err["type"] in ("greater_than_equal", "less_than_equal") and len(bounds) == 2:
            low, high = bounds
            parts.append(f"{flag} {err['input']} is not {low} to {high}; e.g. {flag} {low + 1}.")
        else:
            parts.append(f"{flag} {err['input']!r}: {err['msg']}.")
    return " ".join(parts)


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
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={nproc}", "-m", "nitro_mcp.cli", *rest,
    ]  # fmt: skip
    return subprocess.run(command, check=False).returncode


def _validate(args: argparse.Namespace) -> int:
    from nitro_core import Nitro  # lazy

    call = _call(ValidateCall, args)
    exp = _experiment(args, from_record=call.weights)  # the record's own config, --set on top
    n = Nitro(exp, **call.nitro_kwargs())
    print(
        json.dumps(
            {
                "checkpoint": str(n.checkpoint_source),
                "split": call.split,
                "metrics": n.evaluate(call.split),
            },
            indent=2,
        )
    )
    return 0


def _average(args: argparse.Namespace) -> int:
    run_dir = _run_directory(args.run_dir)
    from nitro_core import average_checkpoints  # lazy

    call = _call(AverageCall, args, run_dir=str(run_dir))
    result = average_checkpoints(**call.average_kwargs(), save=call.save)
    print(json.dumps({"averaged_from": result.averaged_from, "saved": call.save}, indent=2))
    return 0


def _runs(args: argparse.Namespace) -> int:
    run_dir = _run_directory(args.run_dir)
    from nitro_core import read_manifest  # lazy

    entries = read_manifest(run_dir)
    if not entries:
        print(f"{run_dir}: no checkpoints")
    from nitro_core.policy.retention import explain  # lazy

    for run in dict.fromkeys(e.run for e in entries):
        mine = [e for e in entries if e.run == run]
        why = explain(entries, run)
        parent = f", branched from {mine[0].parent}" if mine[0].parent else ""
        print(f"run {run}: {len(mine)} checkpoint(s){parent}")
        for e in mine:
            score = "-" if e.score is None else f"{e.metric}={e.score:.6g} ({e.mode})"
            stop = f"  [{e.stop_reason}]" if e.stop_reason else ""
            print(
                f"  epoch {e.epoch:>4}  step {e.step:>6}  {score:<24} {e.bytes:>10} B  {e.file}{stop}"
            )
            if why.get(e.file):
                print(f"      kept by {'; '.join(why[e.file])}")
    return 0


def _manifest(args: argparse.Namespace) -> int:
    run_dir = _run_directory(args.run_dir)
    from nitro_core import read_manifest  # lazy

    entries = read_manifest(run_dir)
    print(json.dumps([e.model_dump() for e in entries], indent=1))
    return 0


def _run_directory(text: str) -> Path:
    """``text`` as an existing directory; a missing path or a file is refused (reading
    either as an empty run would answer a typo with ``[]``)."""
    path = Path(text)
    if not path.exists():
        raise FileNotFoundError(
            f"{text!r} does not exist; give an existing run directory, e.g. runs/Classifier "
            "(the run_dir a training wrote to)."
        )
    if not path.is_dir():
        raise FileNotFoundError(
            f"{text!r} is a file, not a directory; give a run directory, e.g. runs/Classifier."
        )
    return path


def _info(args: argparse.Namespace) -> int:
    from nitro_core import checkpoint_info  # lazy

    meta: dict[str, Any] = checkpoint_info(Path(args.file))
    if not args.full:
        meta = {k: v for k, v in meta.items() if k not in _BULKY}
    print(json.dumps(meta, indent=2, default=str))
    return 0


def _export(args: argparse.Namespace) -> int:
    if args.format == "hf":
        from nitro_core.hf_export import export_hf  # lazy

        out = export_hf(
            args.source, args.out, dtype=args.dtype, max_shard_size=args.max_shard_size,
            run_dir=args.run_dir,
        )  # fmt: skip
        print(json.dumps({"path": str(out), "format": "hf", "files": sorted(p.name for p in out.iterdir())}, indent=2))  # fmt: skip
        return 0
    if args.dtype is not None or args.max_shard_size != "5GB":
        raise ConfigError(
            "--dtype and --max-shard-size are options of --format hf; add --format hf or drop them."
        )
    from nitro_core import export_weights  # lazy

    written = export_weights(args.source, args.out, run_dir=args.run_dir)
    print(json.dumps({"path": str(written), "format": "weights"}, indent=2))
    return 0


def _schemas(args: argparse.Namespace) -> int:
    from nitro_mcp.schemas import write  # lazy

    for path in write(Path(args.out)):
        print(path)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from nitro_core.verification import verify  # lazy

    checks = verify(args.path)
    for c in checks:
        where = "" if c.listed else "  (not in the manifest)"
        if c.ok:
            print(f"ok       {c.file}  {c.bytes} bytes: {', '.join(c.sections)}{where}")
        else:
            print(f"CORRUPT  {c.file}{where}: {c.problem}")
    bad = sum(not c.ok for c in checks)
    print(f"{len(checks)} record(s) checked, {bad} corrupt")
    return 1 if bad else 0


_COMMANDS = {
    "serve": _serve,
    "demo": _demo,
    "train": _train,
    "validate": _validate,
    "average": _average,
    "runs": _runs,
    "manifest": _manifest,
    "info": _info,
    "verify": _verify,
    "export": _export,
    "schemas": _schemas,
}

if __name__ == "__main__":
    raise SystemExit(main())
