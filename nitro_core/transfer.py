"""Copying a run directory to object storage: ``push`` (``nitro push RUN_DIR s3://...``).

Each record the local manifest lists is read back and checked first (every section against
its digest, the header against the manifest), then uploaded whole under a name no object
has and committed by a conditional replace of the remote manifest, oldest first, each run's
retention applied as its entries recorded it (``keep``); a record the remote manifest lists
already (the same run and digest) is skipped, so a push interrupted anywhere is finished by
running it again, and nothing is listed twice (not even a record whose commit a killed push
had sent and the store applied only after this push read the manifest: the commit itself
checks). Unlisted local files (leftovers, records no manifest lists) are never copied.
"""

from __future__ import annotations

from pathlib import Path

from nitro_core.errors import CheckpointMissing
from nitro_core.policy import retention
from nitro_core.policy.selectors import Checkpointer
from nitro_core.sources.grammar import parse_keep
from nitro_core.store import manifest, shards
from nitro_core.store.manifest import Manifest, ManifestEntry
from nitro_core.store.reader import RecordFile
from nitro_core.store.run import ObjectRun, Retention, RunStore


def push(run_dir: str | Path, to: str) -> list[ManifestEntry]:
    """Copy the records ``run_dir`` lists to the object-store run directory ``to``; the
    entries committed there by this call (a record already there is not among them)."""
    source = Path(run_dir)
    target = ObjectRun.at(to, "to")
    local = manifest.load(source)
    if not local.entries:
        raise CheckpointMissing(
            f"Nothing to push: {str(source)!r} holds no manifest, or one that lists no record. "
            "Give a run directory Nitro trained in, e.g. nitro push runs/Classifier s3://b/a."
        )
    there = {(e.run, e.digest) for e in target.entries()}
    pushed: list[ManifestEntry] = []
    for entry in local.entries:
        if (entry.run, entry.digest) in there:
            continue
        path = source / entry.file
        if entry.is_directory:  # a record directory (FSDP): every shard
            shards.verify(path, entry.expected)
        else:
            with RecordFile(path, entry.expected) as record:
                record.verify()  # no corrupted byte is copied
        committed = target.copy(path, entry, _retention(entry))
        if committed is not None:
            pushed.append(committed)
    _points(target, local)
    return pushed


def _retention(entry: ManifestEntry) -> Retention | None:
    """The retention the run of ``entry`` recorded (its ``keep``), or None (keep all)."""
    if not entry.keep:
        return None
    ckpt, run, pair = Checkpointer(keep=parse_keep(entry.keep)), entry.run, entry.pair
    return lambda entries: set(retention.plan(entries, ckpt, run, pair).delete)


def _points(target: RunStore, local: Manifest) -> None:
    """Every run's points (written or not: Last and Best count them), merged in."""

    def change(state: Manifest) -> None:
        for run, points in local.points.items():
            known = {p.step for p in state.points.get(run, [])}
            for point in points:
                if point.step not in known:
                    state.add_point(run, point)

    if local.points:
        target.commit(change)
