"""``nitro jobs``, ``nitro status`` and ``nitro stop``: the jobs the MCP server started.

A job lives on disk under ``<root>/.nitro/jobs/<job_id>/``, so a terminal reads and stops
the jobs a server (running or not) started in that root. Each command calls its tool's
function (:mod:`nitro_mcp.tools.job_tools`); ``--json`` prints what the tool returns.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from nitro_mcp.cli.common import OK, Handler, cell, command, count, emit, gate, table


def add(sub: Any) -> dict[str, Handler]:
    jobs = command(sub, "jobs", "list the jobs of a root, newest first; prune ended ones",
                   "nitro jobs --state running")  # fmt: skip
    jobs.add_argument("--state", choices=("queued", "running", "succeeded", "failed", "stopped", "lost"),
                      help="only jobs in this state")  # fmt: skip
    jobs.add_argument(
        "--limit", type=count(1, 100), default=20, help="per page (default: %(default)s)"
    )
    jobs.add_argument("--cursor", help="the next page, from the previous page's last line")
    jobs.add_argument("--prune-older-than-h", type=float, metavar="HOURS",
                      help="remove the jobs that ended over HOURS ago (a dry run without --no-dry-run)")  # fmt: skip
    jobs.add_argument("--dry-run", action=argparse.BooleanOptionalAction, default=True,
                      help="with --prune-older-than-h: only say what would go (default: %(default)s)")  # fmt: skip
    _root(jobs)
    status = command(sub, "status", "a job's state, progress, metrics, kept checkpoints and log tail",
                     "nitro status 20261129-072848-63c6e6 --wait 25 --until end")  # fmt: skip
    status.add_argument("job_id", help="a job id (nitro jobs lists them)")
    status.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                        help="wait up to SECONDS (0 to 25) for a change (default: %(default)s)")  # fmt: skip
    status.add_argument("--until", choices=("change", "end"), default="change",
                        help="with --wait: return at an epoch's end too, or only at the job's end (default: %(default)s)")  # fmt: skip
    status.add_argument("--brief", action="store_true", help="only state, epoch, progress, last metrics, error")  # fmt: skip
    _root(status)
    stop = command(sub, "stop", "stop a job after its epoch's checkpoint; --force kills it now",
                   "nitro stop 20261129-072848-63c6e6")  # fmt: skip
    stop.add_argument("job_id", help="a job id (nitro jobs lists them)")
    stop.add_argument("--force", action="store_true", help="kill it now, not after the epoch")
    _root(stop)
    return {"jobs": _jobs, "status": _status, "stop": _stop}


def _root(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default=".", help="the root the jobs were started in (default: .)")


def _jobs(args: argparse.Namespace) -> int:
    from nitro_mcp.tools.job_tools import list_jobs  # lazy: the gate imports torch

    result = list_jobs(gate(args), args.state, args.limit, args.cursor,
                       args.prune_older_than_h, args.dry_run)  # fmt: skip

    def lines() -> Iterator[str]:
        rows = [[j.job_id, j.kind, j.state, j.experiment, j.run_dir, j.epoch, j.created]
                for j in result.jobs]  # fmt: skip
        yield from table(
            ["job", "kind", "state", "experiment", "run_dir", "epoch", "created"], rows
        )
        p = result.pruned
        if p is not None:
            verb = "would remove" if p.dry_run else "removed"
            yield f"pruning {verb} {p.count} ended job(s), {p.bytes} bytes"
            if p.dry_run and p.count:
                yield f"  nitro jobs --prune-older-than-h {args.prune_older_than_h:g} --no-dry-run removes them"
        if result.next_cursor is not None:
            yield f"more: nitro jobs --cursor {result.next_cursor}"

    emit(args, result, lines)
    return OK


def _status(args: argparse.Namespace) -> int:
    import anyio  # lazy

    from nitro_mcp.tools.job_tools import status  # lazy: the gate imports torch

    g = gate(args)
    result = anyio.run(status, g, args.job_id, args.wait, None, args.until, args.brief)

    def lines() -> Iterator[str]:
        data = result.model_dump(exclude_none=True)
        for key in ("job_id", "kind", "state", "phase", "experiment", "run_dir", "run_id"):
            if key in data:
                yield f"{key}: {data[key]}"
        yield f"epoch: {result.epoch}/{cell(result.max_epochs)}  step: {result.step}"
        if result.last_loss is not None or result.last_val:
            val = ", ".join(f"{k}={cell(v)}" for k, v in result.last_val.items())
            yield f"last: loss={cell(result.last_loss)}{'  val ' + val if val else ''}"
        for k in result.kept or []:
            yield f"  kept {k.file}  {'; '.join(k.kept_by)}"
        if result.error:
            yield f"error: {result.error}"
        if result.log_tail:
            yield "log tail:"
            yield from ("  " + line for line in result.log_tail.splitlines()[-20:])

    emit(args, result, lines)
    return OK


def _stop(args: argparse.Namespace) -> int:
    from nitro_mcp.tools.job_tools import stop  # lazy: the gate imports torch

    result = stop(gate(args), args.job_id, args.force)
    follow = f"nitro status {result.job_id} --wait 25 --until end"
    emit(args, result, lambda: [
        f"job {result.job_id}: {result.state}" + (f" ({result.phase})" if result.phase else ""),
        f"{'killed' if args.force else 'stopping after its epoch'}; {follow} follows it",
    ])  # fmt: skip
    return OK
