"""``nitro history``, ``nitro plot`` and ``nitro compare``: what runs did, from their logs.

Each calls what its MCP tool calls (:mod:`nitro_mcp.observe`, :mod:`nitro_mcp.catalog`)
over a :class:`~nitro_mcp.gate.Gate`: a run's rows per epoch as a table, a PNG of runs'
curves written to a file, runs side by side with the config fields that differ.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nitro_core.errors import render
from nitro_mcp.cli.common import (
    OK,
    REFUSED,
    Handler,
    cell,
    command,
    emit,
    gate,
    root_option,
    run_directory,
    say,
    table,
)
from nitro_mcp.terminal import TerminalRenderer


def add(sub: Any) -> dict[str, Handler]:
    history = command(sub, "history", "a run's logged metrics per epoch, newest last",
                      "nitro history runs/Classifier --columns epoch val.acc --last 5")  # fmt: skip
    history.add_argument("run_dir", help="the run directory, e.g. runs/Classifier")
    history.add_argument("--run", help="a run id (default: the run that logged last)")
    history.add_argument("--columns", nargs="+", metavar="COLUMN", help="e.g. epoch val.loss (default: all)")  # fmt: skip
    history.add_argument("--every", type=int, default=1, help="every Nth row, ending at the last (default: 1)")  # fmt: skip
    history.add_argument("--last", type=int, help="the last N rows (after --every)")
    root_option(history)
    plot = command(sub, "plot", "draw runs' curves as a PNG (needs pip install 'nitro[plot]')",
                   "nitro plot runs/Classifier --out curves.png")  # fmt: skip
    plot.add_argument("run_dir", help="the run directory, e.g. runs/Classifier")
    plot.add_argument("--out", default="plot.png", help="the PNG to write (default: %(default)s)")
    plot.add_argument("--runs", nargs="+", metavar="RUN", help="up to 8 run ids (default: the latest)")  # fmt: skip
    plot.add_argument("--metrics", nargs="+", metavar="METRIC", help="e.g. val.acc (default: loss and val metrics)")  # fmt: skip
    root_option(plot)
    compare = command(sub, "compare", "compare 2 to 8 runs, or a seed group's spread to a baseline",
                      "nitro compare runs/a runs/b")  # fmt: skip
    compare.add_argument("sources", nargs="*", metavar="SOURCE",
                         help="'runs/a' (its latest run), 'runs/a:<run id>' or 'runs/a:all'")  # fmt: skip
    compare.add_argument("--group", help="a seed group's id (group-...), instead of SOURCEs")
    compare.add_argument("--baseline", help="with --group: a group id or a SOURCE to measure it against")  # fmt: skip
    root_option(compare)
    return {"history": _history, "plot": _plot, "compare": _compare}


def _history(args: argparse.Namespace) -> int:
    from nitro_mcp.observe import history  # lazy: the gate imports torch

    where = run_directory(args.run_dir).resolve()
    g = gate(args, str(where))
    result = history(g.root, where, args.run, args.columns, args.every, args.last)

    def lines() -> Iterator[str]:
        yield f"{result.run_dir}: run {result.run}, {len(result.rows)} of {result.total_rows} row(s)"
        yield from table(result.columns, [list(r) for r in result.rows])

    emit(args, result, lines)
    return OK


def _plot(args: argparse.Namespace) -> int:
    from nitro_mcp.observe import plot  # lazy: the gate imports torch

    where = run_directory(args.run_dir).resolve()
    g = gate(args, str(where))
    png, parts = plot(g.root, where, args.runs, args.metrics)
    caption = render(parts, TerminalRenderer("plot"))
    out = Path(args.out)
    out.write_bytes(png)
    emit(args, {"path": str(out), "bytes": len(png), "caption": caption},
         lambda: [f"wrote {out} ({len(png)} bytes)", caption])  # fmt: skip
    return OK


def _compare(args: argparse.Namespace) -> int:
    from nitro_mcp.catalog import compare  # lazy: the gate imports torch

    if args.group is not None or args.baseline is not None:
        return _compare_group(args)
    if len(args.sources) < 2:
        say("nitro compare: name 2 to 8 runs (e.g. nitro compare runs/a runs/b), or a seed group "
            "with --group group-... [--baseline runs/a].")  # fmt: skip
        return REFUSED
    g = gate(args, *(s.rpartition(":")[0] or s for s in args.sources))
    result = compare(g.root, [_rooted(g.root, s) for s in args.sources])

    def lines() -> Iterator[str]:
        rows = [[r.source, r.experiment, r.epochs,
                 None if r.best_score is None else f"{r.metric}={cell(r.best_score)}",
                 r.best_epoch, r.wall_s, r.stop_reason] for r in result.runs]  # fmt: skip
        yield from table(
            ["source", "experiment", "epochs", "best", "at epoch", "wall s", "stop"], rows
        )
        for field, values in result.config_diff.items():
            yield f"{field}: {' | '.join(cell(v) for v in values)}"
        for r in result.runs:
            if r.parent:
                changed = ", ".join(
                    f"{name} {cell(old)} -> {cell(new)}"
                    for name, (old, new) in (r.parent_diff or {}).items()
                )
                yield f"{r.source} branched from {r.parent}" + (f": {changed}" if changed else "")

    emit(args, result, lines)
    return OK


def _compare_group(args: argparse.Namespace) -> int:
    from nitro_mcp.group_compare import compare  # lazy: the gate imports torch

    if args.group is None or args.sources:
        say("nitro compare: --group compares a seed group (with --baseline for what it is "
            "measured against) instead of SOURCEs; e.g. nitro compare --group group-... "
            "--baseline runs/a.")  # fmt: skip
        return REFUSED
    g = gate(args)
    baseline = None if args.baseline is None else _rooted(g.root, args.baseline)
    if args.baseline is not None and args.baseline.startswith("group-"):
        baseline = args.baseline
    result = compare(g, args.group, baseline)
    spread = result.spread
    assert spread is not None  # a group's comparison always has one

    def lines() -> Iterator[str]:
        rows = [[m.metric, cell(m.mean), cell(m.std), m.n, cell(m.baseline_mean),
                 cell(m.baseline_std), m.baseline_n, cell(m.sigmas),
                 {True: "yes", False: "no", None: "-"}[m.within_noise]]
                for m in spread.metrics]  # fmt: skip
        yield from table(["metric", "mean", "std", "n", "baseline mean", "baseline std",
                          "baseline n", "sigmas", "within noise"], rows)  # fmt: skip
        yield from (f"left out: {text}" for text in spread.left_out)
        yield spread.note

    emit(args, result, lines)
    return OK


def _rooted(root: Path, source: str) -> str:
    """A compare source as the tool takes it: its run directory relative to the root."""
    where, colon, run = source.partition(":") if ":" in source else (source, "", "")
    path = Path(where).resolve()
    shown = str(path.relative_to(root)) if path.is_relative_to(root) else where
    return f"{shown}{colon}{run}"
