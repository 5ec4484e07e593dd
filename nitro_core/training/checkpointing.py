"""The checkpoint writer: the loop's collaborator that names, writes and commits records,
then carries out the retention plan.

Order of a save, so a crash at any point loses nothing that counted:
decide (from the manifest) -> write the record (tmp, fsync, rename) -> under the lock,
add its entry and drop evicted entries from the manifest -> delete the evicted files.
A crash before the manifest commit leaves an unlisted file that counts for nothing; a
crash after it leaves a deleted entry's file on disk, also unlisted.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path

from nitro_core.errors import NitroWarning, TrainingRefused
from nitro_core.policy import retention
from nitro_core.policy.retention import Pair
from nitro_core.policy.selectors import Checkpointer
from nitro_core.state import records
from nitro_core.store import manifest
from nitro_core.store import recordio as store
from nitro_core.store.manifest import ManifestEntry, StopReason

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
_PLACEHOLDER_SHA = "0" * 64


def record_name(
    epoch: int, step: int, score: float | None, metric: str | None, prefix: str | None
) -> str:
    """``epoch-0006-step-4500-loss=0.0416831.safetensors``."""
    name = f"epoch-{epoch:04d}-step-{step}"
    if score is not None and metric is not None:
        name += f"-{metric}={score:.6g}"
    return (f"{prefix}-" if prefix else "") + name + SUFFIX


class CheckpointWriter:
    """Writes one run's records into ``directory`` under ``ckpt``'s keep rules."""

    def __init__(
        self, directory: Path, ckpt: Checkpointer, run: str, pair: Pair, parent: str | None
    ) -> None:
        self.directory = directory
        self.ckpt = ckpt
        self.run = run
        self.pair = pair
        self.parent = parent

    def save(
        self,
        epoch: int,
        step: int,
        score: float | None,
        stop_reason: StopReason | None,
        snapshot: Callable[[], records.Snapshot],
    ) -> ManifestEntry | None:
        """Write the epoch's record if some selector keeps it; returns its entry, or None."""
        self.directory.mkdir(parents=True, exist_ok=True)
        entries = manifest.read_manifest(self.directory)
        metric, mode = self.pair
        entry = ManifestEntry(
            file=record_name(epoch, step, score, metric, self.ckpt.name), epoch=epoch, step=step,
            score=score, metric=metric, mode=mode, stop_reason=stop_reason, run=self.run,
            parent=self.parent, written=manifest.now_iso(), keep=str(self.ckpt), bytes=0,
            sha256=_PLACEHOLDER_SHA,
        )  # fmt: skip
        point = manifest.Point(epoch=epoch, step=step, score=score, metric=metric, mode=mode)
        if not retention.would_keep(entries, entry, self.ckpt, self.run, self.pair):
            log.debug("epoch %d not written: no selector of %s keeps it", epoch, self.ckpt)
            with store.manifest_lock(self.directory):  # the point still counts for Last/Best
                current = manifest.load(self.directory)
                current.add_point(self.run, point)
                manifest.save(self.directory, current)
            return None
        with store.manifest_lock(self.directory):
            reservation = self._reserve(entry.file, manifest.read_manifest(self.directory))
        try:
            for moved in reservation.set_aside:
                warnings.warn(
                    f"{moved.name.removesuffix('.stale')!r} in {str(self.directory)!r} was left by an "
                    f"interrupted write and is listed by no manifest entry; moved it to "
                    f"{moved.name!r} before writing epoch {epoch}.",
                    NitroWarning,
                    stacklevel=4,
                )
            if reservation.reclaimed:  # .stale files of writers now provably dead
                warnings.warn(
                    store.describe_reclaimed(self.directory, reservation.reclaimed),
                    NitroWarning,
                    stacklevel=4,
                )
            entry = entry.model_copy(update={"file": reservation.path.name})
            tensors, meta = records.encode(snapshot())
            size, sha = store.write_record(reservation, tensors, meta)
        except BaseException:
            store.remove_file(
                store.tmp_path(reservation.path)
            )  # no partial file outlives a failed save
            reservation.release()
            raise
        entry = entry.model_copy(
            update={"bytes": size, "sha256": sha, "written": manifest.now_iso()}
        )
        try:
            with store.manifest_lock(self.directory):
                current = manifest.load(self.directory)
                current.entries.append(entry)
                current.add_point(self.run, point)
                plan = retention.plan(current.entries, self.ckpt, self.run, self.pair)
                doomed = set(plan.delete)
                current.entries = [e for e in current.entries if e.file not in doomed]
                manifest.save(self.directory, current)
                # deleted under the lock: once unlisted, a name may be claimed by another writer
                for file in plan.delete:
                    store.remove_file(self.directory / file)
        finally:
            reservation.release()
        return None if entry.file in doomed else entry

    def _reserve(self, name: str, entries: list[ManifestEntry]) -> store.Reservation:
        """Claim ``name``, or ``name`` with ``-run-<id>`` inserted when another run listed it
        or is writing it right now."""
        listed = {e.file for e in entries}
        for candidate in (name, name.removesuffix(SUFFIX) + f"-run-{self.run}" + SUFFIX):
            if candidate in listed:
                continue
            reservation = store.reserve(self.directory / candidate)
            if reservation is not None:
                return reservation
        raise TrainingRefused(
            f"Run {self.run} cannot write {name!r} in {str(self.directory)!r}: another process is "
            f"writing the same run's record right now. Train run {self.run} from one process at a time."
        )
