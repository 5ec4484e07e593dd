"""The ``nitro`` command: ``demo``, ``runs DIR`` and ``info FILE`` for people at a terminal.

This is an edge of the program, so it prints; the libraries it calls never do.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nitro_core.errors import NitroError

_BULKY = ("rng", "optimizer", "history", "layout", "scheduler", "plateau", "logger")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="nitro", description="Nitro: trustworthy PyTorch checkpoints."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="train the built-in Classifier on CPU and show what was kept"
    )
    demo.add_argument(
        "--run-dir", default="runs/Classifier", help="where to write (default: %(default)s)"
    )
    demo.add_argument(
        "--epochs", type=int, default=6, help="epochs to train (default: %(default)s)"
    )
    runs_p = sub.add_parser("runs", help="list the runs and checkpoints a run directory holds")
    runs_p.add_argument("run_dir")
    info = sub.add_parser("info", help="show a record's header without loading its tensors")
    info.add_argument("file")
    info.add_argument(
        "--full", action="store_true", help="include RNG, optimizer, layout and history"
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(Path(args.run_dir), args.epochs)
        if args.command == "runs":
            return _runs(Path(args.run_dir))
        return _info(Path(args.file), args.full)
    except (NitroError, FileNotFoundError) as exc:
        print(f"nitro {args.command}: {exc}", file=sys.stderr)
        return 1


def _demo(run_dir: Path, epochs: int) -> int:
    from nitro_core import Nitro, read_manifest
    from nitro_core.examples import Classifier
    from nitro_core.retention import plan

    print(f"Training Classifier for {epochs} epochs on CPU into {run_dir} ...")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        n = Nitro(Classifier(max_epochs=epochs), run_dir=run_dir, device="cpu").train()
    for w in caught:
        print(f"  warning: {w.message}")
    for row in n.history:
        val = ", ".join(f"{k}={v:.4f}" for k, v in row["val"].items())
        print(
            f"  epoch {row['epoch']}  step {row['step']:>4}  train_loss={row['train_loss']:.4f}  {val}"
        )
    entries = read_manifest(run_dir)
    kept = plan(entries, n.checkpointer, n.run_id, n.ranking.pair).keep
    print(f"\nRun {n.run_id} ended: {n.stop_reason}. Kept under keep={n.checkpointer}:")
    for e in entries:
        if e.run == n.run_id:
            print(f"  {e.file}  ({'; '.join(kept.get(e.file, ('-',)))})")
    others = {e.run for e in entries} - {n.run_id}
    if others:
        print(f"  (+ {len(others)} earlier run(s) in this directory, left untouched)")
    print(f"\nNext: nitro runs {run_dir}   |   nitro info {run_dir / entries[-1].file}")
    return 0


def _runs(run_dir: Path) -> int:
    from nitro_core import read_manifest

    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"{str(run_dir)!r} is not a directory; give a run directory such as runs/Classifier"
        )
    entries = read_manifest(run_dir)
    if not entries:
        print(f"{run_dir}: no checkpoints")
        return 0
    for run in dict.fromkeys(e.run for e in entries):
        mine = [e for e in entries if e.run == run]
        parent = f", branched from {mine[0].parent}" if mine[0].parent else ""
        print(f"run {run}: {len(mine)} checkpoint(s){parent}")
        for e in mine:
            score = "-" if e.score is None else f"{e.metric}={e.score:.6g} ({e.mode})"
            stop = f"  [{e.stop_reason}]" if e.stop_reason else ""
            print(
                f"  epoch {e.epoch:>4}  step {e.step:>6}  {score:<24} {e.bytes:>10} B  {e.file}{stop}"
            )
    return 0


def _info(path: Path, full: bool) -> int:
    from nitro_core import checkpoint_info

    meta: dict[str, Any] = checkpoint_info(path)
    if not full:
        meta = {k: v for k, v in meta.items() if k not in _BULKY}
        meta["tensors"] = "use --full for the layout"
    print(json.dumps(meta, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
