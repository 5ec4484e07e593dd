"""The runs and records family: ``nitro_runs``, ``nitro_manifest``, ``nitro_checkpoint_info``,
``nitro_verify`` and ``nitro_experiments``.

Read-only views of what is on disk, each a page or a bounded reply: the run directories
under the root and the runs in one, a manifest's entries, one record's header (no tensor
read), every byte of a record or a run checked against its digests, and the registered
experiments with their fields and splits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from nitro_core.errors import ConfigError
from nitro_core.info import checkpoint_info
from nitro_core.store import listing, manifest
from nitro_core.verification import verify
from nitro_mcp import catalog, models
from nitro_mcp.echo import clip, clip_text
from nitro_mcp.experiments import listing as experiments_listing
from nitro_mcp.gate import Gate, page
from nitro_mcp.paths import inside_root, shown
from nitro_mcp.record_fit import refuse_non_record
from nitro_mcp.replies import NitroServer, fit, shrink
from nitro_mcp.tools.declare import Cursor, EntriesLimit, RunsLimit, off_loop, tool

HEADER_MAX = 6000  # characters of a record's header in a reply (cut by replies.shrink)
_BULKY = ("rng", "optimizer", "history", "scheduler", "plateau", "position", "data")


def register(server: NitroServer, gate: Gate) -> None:
    @tool(server, "The run directories under the root, or one's runs (checkpoints, best, "
          "parent).")  # fmt: skip
    async def nitro_runs(
        run_dir: Annotated[str | None, Field(description="Omit to list them all.")] = None,
        limit: RunsLimit = 20,
        cursor: Cursor = None,
    ) -> models.RunsResult:
        return await off_loop(runs, gate, run_dir, limit, cursor)

    @tool(server, "A run directory's manifest, paginated: one entry per kept checkpoint.")
    async def nitro_manifest(
        run_dir: Annotated[str, Field(description="A run directory.")],
        limit: EntriesLimit = 20,
        cursor: Cursor = None,
    ) -> models.ManifestPage:
        return await off_loop(manifest_page, gate, run_dir, limit, cursor)

    @tool(server, "A checkpoint's header (no tensors read): epoch, step, run, config, metrics, "
          "layout.")  # fmt: skip
    async def nitro_checkpoint_info(
        path: Annotated[str, Field(description="A record or URL.")],
    ) -> models.CheckpointInfoResult:
        return await off_loop(record_header, gate, path)

    @tool(server, "Check every byte of a record, or of a run directory's records, against "
          "digests.")  # fmt: skip
    async def nitro_verify(
        path: Annotated[str, Field(description="A record, run directory or URL.")],
    ) -> models.VerifyResult:
        return await off_loop(verify_path, gate, path)

    @tool(server, "Registered experiments: config fields (Host: may change on resume), splits, "
          "monitor; import errors.")  # fmt: skip
    async def nitro_experiments(
        name: Annotated[str | None, Field(description="One; default all.")] = None,
    ) -> models.ExperimentsResult:
        return await off_loop(lambda: experiments_listing(gate.registry, gate.described, name))


def runs(
    gate: Gate, run_dir: str | None, limit: int = 20, cursor: str | None = None
) -> models.RunsResult:
    if run_dir is None:  # every run directory under the root
        return catalog.run_dirs(gate.root, None, limit, cursor)
    where = gate.existing_dir(run_dir)
    if not catalog.holds_manifest(where):  # the run directories below it, with a hint
        return catalog.run_dirs(gate.root, where, limit, cursor)
    entries = manifest.read_manifest(where)
    start, limit = page(cursor, limit)
    names = list(dict.fromkeys(e.run for e in reversed(entries)))  # last written first
    out = [_run_summary(entries, run) for run in names[start : start + limit]]
    shown_n = fit(out, limit)  # a page stays within the reply budget
    end = start + shown_n
    return models.RunsResult(
        run_dir=shown(gate.root, where), runs=out[:shown_n], total=len(names),
        next_cursor=str(end) if end < len(names) else None,
    )  # fmt: skip


def manifest_page(gate: Gate, run_dir: str, limit: int, cursor: str | None) -> models.ManifestPage:
    url = gate.storage_url(run_dir)  # on object storage: the manifest object, under --storage
    where = str(url) if url else gate.existing_dir(run_dir)
    entries = listing.read_manifest(where)
    start, limit = page(cursor, limit)
    end = start + fit(entries[start:], limit)  # a page stays within the reply budget
    return models.ManifestPage(
        run_dir=shown(gate.root, where), total=len(entries), entries=entries[start:end],
        next_cursor=str(end) if end < len(entries) else None,
    )  # fmt: skip


def record_header(gate: Gate, path: str) -> models.CheckpointInfoResult:
    url = gate.storage_url(path, "path")  # a listed record under --storage: its header alone
    where: Path | str = str(url) if url else inside_root(gate.root, path, "path")
    if isinstance(where, Path):
        if not (where.is_file() or (where / "header.json").is_file()):  # or a record directory
            raise ConfigError(
                f"path={clip(path)} is not a file under the server's root; nitro_manifest lists a run's files."
            )
        refuse_non_record(where, clip_text(path), _run_dir_of(gate.root, where))
    header = checkpoint_info(where)
    for key in _BULKY:
        if header.get(key) is not None:
            header[key] = "(omitted: use `nitro info --full` at a terminal)"
    layout = header.get("layout")
    if isinstance(layout, dict):
        header["layout"] = {
            "params": len(layout.get("params", [])), "buffers": len(layout.get("buffers", [])),
            "groups": [len(g) for g in layout.get("groups", [])],
        }  # fmt: skip
    return models.CheckpointInfoResult(
        path=shown(gate.root, where), header=shrink(header, HEADER_MAX)
    )


def verify_path(gate: Gate, path: str) -> models.VerifyResult:
    url = gate.storage_url(path, "path")  # a run directory or a record under --storage
    where: Path | str = str(url) if url else inside_root(gate.root, path, "path")
    checks = verify(where)
    problems = [c for c in checks if not c.ok]
    kept = fit(problems, 50) if problems else 0
    return models.VerifyResult(
        path=shown(gate.root, where), checked=len(checks), ok=not problems,
        problems=problems[:kept], more=len(problems) - kept,
    )  # fmt: skip


def _run_summary(entries: list[manifest.ManifestEntry], run: str) -> models.RunSummary:
    mine = manifest.run_entries(entries, run)
    scored = [e for e in mine if e.score is not None]
    best = None
    if scored:
        pick = min if scored[-1].mode == "min" else max
        best = pick(e.score for e in scored if e.score is not None and e.pair == scored[-1].pair)
    return models.RunSummary(
        run=run, checkpoints=len(mine), epochs=[e.epoch for e in mine][-100:],  # nitro_manifest: all
        metric=mine[-1].metric, mode=mine[-1].mode, best_score=best, latest_file=mine[-1].file,
        stop_reason=mine[-1].stop_reason, parent=mine[0].parent,
    )  # fmt: skip


def _run_dir_of(root: Path, where: Path) -> str | None:
    """The run directory (one holding a manifest) ``where`` lies in, shown from the root."""
    for parent in where.parents:
        if parent != root and root not in parent.parents:
            return None
        if (parent / "manifest.json").is_file():
            return shown(root, parent)
    return None
