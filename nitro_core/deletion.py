"""Deleting checkpoints to free space: ``delete_checkpoints``, a dry run by default.

The decision is :func:`nitro_core.policy.deletion_plan.plan_deletion` (pure, over the manifest);
:func:`nitro_core.store.removal.remove` carries it out under the manifest lock. Only what
the manifest lists for the runs named goes (records, and for a whole run its points and its
log); another run's files and entries are never touched, and a run being trained right now
is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePath

from nitro_core.errors import CheckpointNotFound
from nitro_core.policy.deletion_plan import DeletionPlan, plan_deletion
from nitro_core.store.manifest import Manifest, ManifestEntry
from nitro_core.store.removal import Removed, RemovedFile
from nitro_core.store.run import open_run


@dataclass(frozen=True)
class Deletion:
    """What a deletion removed, or with ``dry_run`` would remove."""

    run_dir: PurePath  # a Path, or an object-store run directory (str: its URL)
    entries: tuple[ManifestEntry, ...]  # manifest entries dropped, their records with them
    runs: tuple[str, ...]  # runs dropped whole: their points and log too
    points: int  # points dropped with those runs
    files: tuple[RemovedFile, ...]  # records and logs: path (relative to run_dir), bytes, run
    missing: tuple[str, ...]  # listed records already gone from disk
    skipped: tuple[str, ...]  # listed names holding a link or a directory: left in place
    dry_run: bool

    @property
    def bytes(self) -> int:
        """Bytes on disk the deletion frees (or would free)."""
        return sum(f.bytes for f in self.files)


def delete_checkpoints(
    run_dir: str | Path,
    run: str | None = None,
    files: Sequence[str] | str | None = None,
    dry_run: bool = True,
) -> Deletion:
    """Delete a whole run (``run=``: its records, points and log), some records
    (``files=``: names as the manifest lists them; with ``run=`` each must be that run's), or
    with neither every run of ``run_dir``; ``run_dir`` may be ``s3://bucket/prefix/run``
    (no lock there: a run being trained there is not detected). ``dry_run=True`` (the default) only reports what
    would go; pass ``dry_run=False`` to free the space."""
    names = (files,) if isinstance(files, str) else None if files is None else tuple(files)
    where = open_run(run_dir)
    if not where.exists():
        raise CheckpointNotFound(
            f"Nothing to delete: {str(where)!r} is not a directory. Give a run directory, "
            "one that holds a manifest.json."
        )
    plan, removed = where.remove(partial(_decide, run, names, str(where)), dry_run)
    return _deletion(where.shown, plan, removed, dry_run)


def _deletion(where: PurePath, plan: DeletionPlan, removed: Removed, dry_run: bool) -> Deletion:
    return Deletion(
        run_dir=where, entries=plan.entries, runs=plan.runs, points=plan.points,
        files=removed.files, missing=removed.missing, skipped=removed.skipped, dry_run=dry_run,
    )  # fmt: skip


def _decide(
    run: str | None, files: tuple[str, ...] | None, where: str, current: Manifest
) -> DeletionPlan:
    return plan_deletion(current.entries, current.points, run, files, where)
