"""``nitro delete`` and ``nitro export``: what leaves a run directory.

``delete`` removes a run or some records (a dry run unless ``--no-dry-run``, refused while a
job of the root uses the run) through :func:`nitro_mcp.delete_call.delete`, the function
``nitro_delete`` calls; ``export`` writes a checkpoint's weights to a new safetensors file
or a Hugging Face directory through ``nitro_export``'s function.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nitro_core.errors import ConfigError
from nitro_mcp.cli.common import (
    OK,
    Handler,
    absolute,
    command,
    emit,
    gate,
    root_option,
    run_place,
)


def add(sub: Any) -> dict[str, Handler]:
    delete = command(sub, "delete", "delete a run or some records: a dry run unless --no-dry-run",
                     "nitro delete runs/Classifier --run a1b2c3d4 --no-dry-run")  # fmt: skip
    delete.add_argument("run_dir", help="the run directory, e.g. runs/Classifier")
    delete.add_argument("--run", help="a run id (without --file: every run)")
    delete.add_argument("--file", action="append", dest="files", metavar="FILE",
                        help="a record file name as nitro manifest lists it (repeatable)")  # fmt: skip
    delete.add_argument("--dry-run", action=argparse.BooleanOptionalAction, default=True,
                        help="only say what would go (default: %(default)s)")  # fmt: skip
    root_option(delete)
    export = command(sub, "export", "write a checkpoint's weights to a file, or an HF directory",
                     'nitro export "latest => Average(Last(3))" exports/model-hf --run-dir runs/HFCausalLM --format hf')  # fmt: skip
    export.add_argument("source", help="'latest => best', another source, or a record's path")
    export.add_argument("out", help="a new .safetensors file, or with --format hf a new directory")
    export.add_argument("--run-dir", help="the source's run directory, e.g. runs/Classifier")
    export.add_argument("--format", choices=("weights", "hf"), default="weights",
                        help="hf: config.json and model.safetensors (default: %(default)s)")  # fmt: skip
    export.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                        help="--format hf: cast floating weights to this dtype")  # fmt: skip
    export.add_argument("--max-shard-size", default="5GB",
                        help="--format hf: the largest shard (default: %(default)s)")  # fmt: skip
    root_option(export)
    return {"delete": _delete, "export": _export}


def _delete(args: argparse.Namespace) -> int:
    from nitro_mcp.delete_call import delete, human_bytes  # lazy: the gate imports torch

    given = run_place(args.run_dir)  # a directory, or s3://...
    g = gate(args, given)
    result = delete(g.root, g.jobs, given, g.where(given), args.run, args.files, args.dry_run)

    def lines() -> Iterator[str]:
        verb = "would delete" if result.dry_run else "deleted"
        yield (f"{result.run_dir}: {verb} {result.files_total} file(s), {human_bytes(result.bytes)}, "
               f"{result.entries} manifest entries")  # fmt: skip
        for run in result.runs:
            yield f"  run {run} (whole)"
        for f in result.files:
            yield f"  {f.file}  run {f.run}  epoch {f.epoch}  {f.bytes} B"
        for name in result.missing:
            yield f"  already gone: {name}"
        for name in result.skipped:
            yield f"  left in place (a link or directory, or an object not deleted): {name}"
        if result.dry_run and result.files_total:
            yield "Nothing was deleted; add --no-dry-run to delete them."

    emit(args, result, lines)
    return OK


def _export(args: argparse.Namespace) -> int:
    from nitro_mcp.tools.lifecycle_tools import export  # lazy: the gate imports torch

    if args.format != "hf" and (args.dtype is not None or args.max_shard_size != "5GB"):
        raise ConfigError(
            "--dtype and --max-shard-size are options of --format hf; add --format hf or drop them."
        )
    out = str(Path(args.out).resolve())
    run_dir = None if args.run_dir is None else absolute(args.run_dir, "run_dir")
    g = gate(args, *(p for p in (run_dir, out) if p is not None))
    result = export(g, _source(args.source), out, run_dir, args.format, args.dtype,
                    args.max_shard_size)  # fmt: skip
    emit(args, result, lambda: [
        f"wrote {result.path} ({result.bytes} bytes)",
        f"from {result.source_file or '-'}: run {result.run or '-'}, epoch {result.epoch or '-'}"
        + (f", an average of {result.averaged_files} records" if result.averaged_files else ""),
    ])  # fmt: skip
    return OK


def _source(text: str) -> str:
    """A source; a record's path made absolute, as the tool resolves paths in the root."""
    path = Path(text)
    return str(path.resolve()) if "=>" not in text and path.exists() else text
