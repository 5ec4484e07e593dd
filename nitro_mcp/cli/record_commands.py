"""``nitro runs``, ``manifest``, ``info``, ``verify``, ``experiments`` and ``push``: the records family.

Each calls its MCP tool's function (:mod:`nitro_mcp.tools.record_tools`) over a
:class:`~nitro_mcp.gate.Gate`, so ``--json`` prints what the tool returns; the default
output is the same data as lines. ``runs`` adds each checkpoint of a run directory and the
selectors that keep it; ``info --full`` the header's bulky parts, which the tool leaves out;
``verify`` a line per record checked.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nitro_mcp.cli.common import (
    FAILED,
    OK,
    Handler,
    absolute,
    cell,
    command,
    count,
    emit,
    gate,
    root_option,
    run_directory,
    run_place,
    table,
)


def add(sub: Any) -> dict[str, Handler]:
    runs = command(sub, "runs", "list the runs and checkpoints a run directory holds",
                   "nitro runs runs/Classifier")  # fmt: skip
    runs.add_argument("run_dir", nargs="?", help="a run directory (default: every one under the root)")  # fmt: skip
    _page_args(runs, 20)
    manifest = command(sub, "manifest", "list a run directory's manifest: one entry per kept checkpoint",
                       "nitro manifest runs/Classifier")  # fmt: skip
    manifest.add_argument("run_dir", help="the run directory, e.g. runs/Classifier")
    _page_args(manifest, 200)
    info = command(sub, "info", "show a record's header without loading its tensors",
                   "nitro info runs/Classifier/epoch-0003-step-36-acc=0.8125.safetensors")  # fmt: skip
    info.add_argument("file", help="a .safetensors record")
    info.add_argument("--full", action="store_true", help="include RNG, optimizer, layout and history")  # fmt: skip
    root_option(info)
    verify = command(sub, "verify", "check every byte of a record, or of a run directory's records",
                     "nitro verify runs/Classifier")  # fmt: skip
    verify.add_argument("path", help="a .safetensors record or a run directory")
    root_option(verify)
    experiments = command(sub, "experiments", "list the registered experiments, their fields and splits",
                          "nitro experiments Classifier")  # fmt: skip
    experiments.add_argument("name", nargs="?", help="one experiment (default: all)")
    experiments.add_argument("--experiment-module", action="append", default=[], metavar="MODULE",
                             help="also register the Experiment subclasses of MODULE")  # fmt: skip
    root_option(experiments)
    push = command(sub, "push", "copy a run directory's records to object storage (S3)",
                   "nitro push runs/Classifier s3://my-bucket/runs/Classifier")  # fmt: skip
    push.add_argument("run_dir", help="the local run directory, e.g. runs/Classifier")
    push.add_argument("to", help="the run directory on object storage, s3://bucket/prefix/run")
    return {"runs": _runs, "manifest": _manifest, "info": _info, "verify": _verify,
            "experiments": _experiments, "push": _push}  # fmt: skip


def _page_args(p: argparse.ArgumentParser, limit: int) -> None:
    p.add_argument(
        "--limit",
        type=count(1, 100 if limit < 200 else 200),
        default=limit,
        help="per page (default: %(default)s)",
    )
    p.add_argument("--cursor", help="the next page, from the previous page's last line")
    root_option(p)


def _runs(args: argparse.Namespace) -> int:
    from nitro_mcp.tools.record_tools import runs  # lazy: the gate imports torch

    given = None if args.run_dir is None else str(run_directory(args.run_dir).resolve())
    g = gate(args, given)
    result = runs(g, given, args.limit, args.cursor)
    emit(args, result, lambda: _runs_lines(result, g.root, args))
    return OK


def _runs_lines(result: Any, root: Path, args: argparse.Namespace) -> Iterator[str]:
    from nitro_core import read_manifest  # lazy
    from nitro_core.policy.retention import explain  # lazy

    if not result.runs and not result.run_dirs:
        yield f"{result.run_dir or root}: no checkpoints"
    entries = read_manifest(root / result.run_dir) if result.runs else []
    for r in result.runs:
        best = "" if r.best_score is None else f", best {r.metric}={r.best_score:.6g} ({r.mode})"
        parent = f", branched from {r.parent}" if r.parent else ""
        yield f"run {r.run}: {r.checkpoints} checkpoint(s){best}{parent}"
        why = explain(entries, r.run)
        for e in (e for e in entries if e.run == r.run):
            score = "-" if e.score is None else f"{e.metric}={e.score:.6g} ({e.mode})"
            stop = f"  [{e.stop_reason}]" if e.stop_reason else ""
            yield f"  epoch {e.epoch:>4}  step {e.step:>6}  {score:<24} {e.bytes:>10} B  {e.file}{stop}"
            if why.get(e.file):
                yield f"      kept by {'; '.join(why[e.file])}"
    if result.run_dirs:
        rows = [[d.run_dir, d.run_count, d.checkpoints, d.experiment,
                 None if d.best_score is None else f"{d.metric}={cell(d.best_score)}", d.bytes]
                for d in result.run_dirs]  # fmt: skip
        yield from table(["run_dir", "runs", "checkpoints", "experiment", "best", "bytes"], rows)
    if result.next_cursor is not None:
        yield _more("runs", args.run_dir, result.next_cursor)


def _more(name: str, path: str | None, cursor: str) -> str:
    where = f" {path}" if path else ""
    return f"more: nitro {name}{where} --cursor {cursor}"


def _manifest(args: argparse.Namespace) -> int:
    from nitro_mcp.tools.record_tools import manifest_page  # lazy: the gate imports torch

    given = run_place(args.run_dir)  # a URL as written, else an existing directory
    result = manifest_page(gate(args, given), given, args.limit, args.cursor)

    def lines() -> Iterator[str]:
        rows = [[e.run, e.epoch, e.step, None if e.score is None else f"{e.metric}={cell(e.score)}",
                 e.bytes, e.file, e.stop_reason] for e in result.entries]  # fmt: skip
        yield f"{result.run_dir}: {result.total} entries"
        if rows:
            yield from table(["run", "epoch", "step", "score", "bytes", "file", "stop"], rows)
        if result.next_cursor is not None:
            yield _more("manifest", args.run_dir, result.next_cursor)

    emit(args, result, lines)
    return OK


def _info(args: argparse.Namespace) -> int:
    from nitro_mcp.tools.record_tools import record_header  # lazy: the gate imports torch

    given = absolute(args.file, "path")  # a URL as written: its header by ranged reads
    if args.full:  # the whole header, which no tool reply carries
        from nitro_core import checkpoint_info  # lazy

        data: Any = {"path": args.file, "header": checkpoint_info(given)}
    else:
        data = record_header(gate(args, given, up=2), given)
    header = data["header"] if isinstance(data, dict) else data.header
    emit(args, data, lambda: (f"{k}: {_value(v)}" for k, v in header.items()))
    return OK


def _value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, default=str)


def _verify(args: argparse.Namespace) -> int:
    if args.json:
        from nitro_mcp.tools.record_tools import verify_path  # lazy: the gate imports torch

        given = absolute(args.path, "path")
        result = verify_path(gate(args, given, up=2), given)
        emit(args, result, list)
        return OK if result.ok else FAILED
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
    return FAILED if bad else OK


def _push(args: argparse.Namespace) -> int:
    from nitro_core.transfer import push  # lazy

    pushed = push(run_directory(args.run_dir), args.to)
    data = {"run_dir": args.run_dir, "to": args.to,
            "pushed": [e.model_dump(mode="json") for e in pushed]}  # fmt: skip

    def lines() -> Iterator[str]:
        for e in pushed:
            yield f"pushed {e.file}  {e.bytes} B  (run {e.run}, step {e.step})"
        yield f"{len(pushed)} record(s) committed to {args.to}"

    emit(args, data, lines)
    return OK


def _experiments(args: argparse.Namespace) -> int:
    from nitro_mcp.experiments import listing  # lazy: the registry imports torch

    g = gate(args)
    result = listing(g.registry, g.described, args.name)

    def lines() -> Iterator[str]:
        for x in result.experiments:
            yield f"{x.name}: {x.description}"
            yield f"  splits: {', '.join(x.splits) if x.splits else '-'}"
            yield f"  monitor: {', '.join(x.monitor) if x.monitor else '-'}"
            rows = [[f.name, f.type, json.dumps(f.default, default=str), "host" if f.host else ""]
                    for f in x.fields]  # fmt: skip
            yield from ("  " + line for line in table(["field", "type", "default", ""], rows))
        if result.more:
            yield f"more: {', '.join(result.more)} (nitro experiments NAME describes one)"
        for m in result.modules:
            yield f"module {m.module}: {m.error or ', '.join(m.experiments)}"

    emit(args, result, lines)
    return OK
