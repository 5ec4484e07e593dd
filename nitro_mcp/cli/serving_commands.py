"""``nitro serve``, ``nitro demo`` and ``nitro schemas``: the server itself.

``serve`` runs the MCP server on stdio (its stdout is the protocol) or on streamable HTTP on
127.0.0.1 with a bearer token; ``demo`` starts it and drives it as an agent would, printing
what happened; ``schemas`` writes the tools' and records' JSON Schemas under schemas/.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from nitro_core.jobs.call_models import SlurmOptions
from nitro_mcp.cli.common import OK, Handler, command, emit


def add(sub: Any) -> dict[str, Handler]:
    serve = command(sub, "serve", "run the MCP server that agents launch (stdio by default)",
                    "nitro serve --root . --experiment-module experiments.py", json_output=False)  # fmt: skip
    serve.add_argument("--root", default=".", help="every path resolves inside this directory (default: .)")  # fmt: skip
    serve.add_argument("--http", action="store_true", help="serve streamable HTTP on 127.0.0.1 instead of stdio")  # fmt: skip
    serve.add_argument("--port", type=int, default=8765, help="HTTP port (default: %(default)s)")
    serve.add_argument("--token", help="bearer token for --http (default: generated and printed to stderr)")  # fmt: skip
    serve.add_argument("--max-jobs", type=int, default=2, help="jobs running at once; later ones queue (default: 2)")  # fmt: skip
    serve.add_argument("--max-eval-jobs", type=int, default=2,
                       help="validations and averages running at once, beside --max-jobs trainings (default: 2)")  # fmt: skip
    serve.add_argument("--experiment-module", action="append", default=[], metavar="MODULE",
                       help="register the Experiment subclasses of MODULE: a dotted module importable "
                       "from the root, or a .py file inside it (repeatable; re-imported when edited)")  # fmt: skip
    serve.add_argument("--import-timeout", type=float, default=30.0, metavar="SECONDS",
                       help="the longest an --experiment-module may take to import before it is "
                       "listed as failed (default: %(default)s)")  # fmt: skip
    serve.add_argument("--executor", choices=("local", "slurm"), default="local",
                       help="what runs a nitro_train that names none: worker processes here, "
                       "or sbatch on a Slurm cluster (default: %(default)s)")  # fmt: skip
    serve.add_argument("--no-warm-worker", dest="warm_worker", action="store_false",
                       help="run each validation and average in a worker of its own instead of "
                       "the warm worker (torch imported once, for all of them)")  # fmt: skip
    serve.add_argument("--storage", metavar="S3_URL",
                       help="also take run directories under this s3://bucket/prefix (AWS settings)")  # fmt: skip
    serve.add_argument("--slurm-partition", help="with --executor slurm: the default partition")
    serve.add_argument("--slurm-account", help="with --executor slurm: the default account")

    demo = command(sub, "demo", "start the server and drive it over stdio as an agent would",
                   "nitro demo --epochs 3", json_output=False)  # fmt: skip
    demo.add_argument("--root", default=".", help="where runs/ and .nitro/ go (default: .)")
    demo.add_argument("--epochs", type=int, default=6, help="epochs to train (default: %(default)s)")  # fmt: skip

    schemas = command(sub, "schemas", "regenerate the JSON Schemas under schemas/",
                      "nitro schemas --out schemas")  # fmt: skip
    schemas.add_argument("--out", default="schemas", help="where to write (default: %(default)s)")
    return {"serve": _serve, "demo": _demo, "schemas": _schemas}


def _serve(args: argparse.Namespace) -> int:
    from nitro_mcp.serve import serve_http, serve_stdio  # lazy
    from nitro_mcp.server import build_server  # lazy

    server = build_server(
        Path(args.root), max_jobs=args.max_jobs, experiment_modules=tuple(args.experiment_module),
        max_eval_jobs=args.max_eval_jobs, import_timeout_s=args.import_timeout,
        executor=args.executor, slurm_options=_slurm_options(args), warm_worker=args.warm_worker,
        storage=args.storage,
    )  # fmt: skip
    if args.http:
        serve_http(server, args.port, args.token)
    else:
        serve_stdio(server)
    return OK


def _slurm_options(args: argparse.Namespace) -> SlurmOptions | None:
    """``--slurm-partition`` and ``--slurm-account`` as a call's default Slurm options."""
    if args.slurm_partition is None and args.slurm_account is None:
        return None
    return SlurmOptions(partition=args.slurm_partition, account=args.slurm_account)


def _demo(args: argparse.Namespace) -> int:
    from nitro_mcp.demo import main as demo_main  # lazy

    return demo_main(Path(args.root).resolve(), args.epochs)


def _schemas(args: argparse.Namespace) -> int:
    from nitro_mcp.schemas import write  # lazy

    written = [str(p) for p in write(Path(args.out))]
    emit(args, written, lambda: written)
    return OK
