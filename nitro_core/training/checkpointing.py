"""The checkpoint writer: the loop's collaborator that names, writes and commits records,
then carries out the retention plan.

Order of a save, so a crash at any point loses nothing that counted:
decide (from the manifest) -> write the record (tmp, fsync, rename) -> under the lock,
add its entry and drop evicted entries from the manifest -> delete the evicted files.
A crash before the manifest commit leaves an unlisted file that counts for nothing; a
crash after it leaves a deleted entry's file on disk, also unlisted.

With ``Checkpointer(async_write=True)`` (the default) the training thread only decides,
claims the file name and copies the state into host buffers
(:class:`~nitro_core.state.hostcopy.HostCopier`); the write, the manifest commit and the
retention run on one background thread. At most one write is in flight: the next point
waits for it (saying so in the log), and its error, if it failed, is raised there or by
:meth:`CheckpointWriter.drain` at the end of ``train()``, the same error a synchronous
write raises. The manifest lists a record only once it is durable, as before.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from nitro_core.errors import NitroWarning, TrainingRefused
from nitro_core.policy import retention
from nitro_core.policy.retention import Pair
from nitro_core.policy.selectors import Checkpointer
from nitro_core.state import records
from nitro_core.state.hostcopy import HostCopier
from nitro_core.store import manifest
from nitro_core.store import recordio as store
from nitro_core.store.manifest import ManifestEntry, StopReason

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
_PLACEHOLDER_DIGEST = "xxh3-128-tree:" + "0" * 32


def record_name(
    epoch: int,
    step: int,
    score: float | None,
    metric: str | None,
    prefix: str | None,
    batch: int | None = None,
) -> str:
    """``epoch-0006-step-4500-loss=0.0416831.safetensors``; a mid-epoch record's says its
    batch: ``epoch-0003-batch-0250-step-4500-loss=0.0416831.safetensors``."""
    name = f"epoch-{epoch:04d}" + (f"-batch-{batch:04d}" if batch is not None else "")
    name += f"-step-{step}"
    if score is not None and metric is not None:
        name += f"-{metric}={score:.6g}"
    return (f"{prefix}-" if prefix else "") + name + SUFFIX


def _detached(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` sharing nothing the training thread changes while a background write reads
    it: a JSON copy, except the ``history``, whose list is copied but not its rows (a row
    never changes once appended), so a point's cost does not grow with the run's points."""
    copied = json.loads(json.dumps({k: v for k, v in meta.items() if k != "history"}))
    return {k: list(v) if k == "history" else copied[k] for k, v in meta.items()}


def wait_for(pending: Future[Any] | None, what: str, who: str) -> None:
    """Block until a write in flight is done and raise its error; ``who`` (when given) is
    logged as waiting for ``what`` if it is not done yet. Both writers wait this way."""
    if pending is None:
        return
    if not pending.done() and who:
        log.info("%s waits for the write of %s, still in flight", who, what)
    pending.result()


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
        self._copier = HostCopier() if ckpt.async_write else None
        self._thread: ThreadPoolExecutor | None = None
        self._pending: Future[Any] | None = None
        self._pending_what = ""

    def save(
        self,
        epoch: int,
        step: int,
        score: float | None,
        stop_reason: StopReason | None,
        snapshot: Callable[[], records.Snapshot],
        batch: int | None = None,
    ) -> ManifestEntry | None:
        """Offer the point's record: write it if some selector keeps it. Returns its
        committed entry (None when nothing was kept, and always under ``async_write``: the
        write is then still in flight, and :meth:`wait` raises its error)."""
        where = f"epoch {epoch}" + (f" batch {batch}" if batch is not None else "")
        self.wait(f"The checkpoint point at {where} (step {step})")
        self.directory.mkdir(parents=True, exist_ok=True)
        entries = manifest.read_manifest(self.directory)
        metric, mode = self.pair
        entry = ManifestEntry(
            file=record_name(epoch, step, score, metric, self.ckpt.name, batch), epoch=epoch,
            batch=batch, step=step, score=score, metric=metric, mode=mode,
            stop_reason=stop_reason, run=self.run, parent=self.parent,
            written=manifest.now_iso(), keep=str(self.ckpt), bytes=0, digest=_PLACEHOLDER_DIGEST,
        )  # fmt: skip
        point = manifest.Point(
            epoch=epoch, batch=batch, step=step, score=score, metric=metric, mode=mode
        )
        if not retention.would_keep(entries, entry, self.ckpt, self.run, self.pair):
            log.debug("%s not written: no selector of %s keeps it", where, self.ckpt)
            return self._run(f"the point at {where}", self._add_point, point)
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
            if self._copier is None:
                tensors, meta = records.encode(snapshot())
            else:  # the training thread waits for the host copy only
                tensors, meta = records.encode(snapshot(), leaf=self._copier)
                self._copier.finish()
                meta = _detached(meta)  # nothing the training thread changes later
        except BaseException:
            store.remove_file(store.tmp_path(reservation.path))  # no partial file outlives it
            reservation.release()
            raise
        return self._run(repr(entry.file), self._commit, reservation, entry, point, tensors, meta)

    def _run(self, what: str, job: Callable[..., Any], *args: Any) -> Any:
        """Run ``job`` here (synchronous writes) or on the writer thread."""
        if self._copier is None:
            return job(*args)
        if self._thread is None:
            # at the training thread's priority: a writer niced below it, on a CPU run whose
            # torch threads keep every core busy, was still writing at the next point, which
            # then waited for it (bench/async_write.py: 200 ms blocked a point, against 30)
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nitro-writer")
        self._pending, self._pending_what = self._thread.submit(job, *args), what
        return None

    def wait(self, who: str = "") -> None:
        """Block until the write in flight, if any, is committed; raise its error if it
        failed. ``who`` names the waiter in the log line saying it waits."""
        pending, self._pending = self._pending, None
        wait_for(pending, self._pending_what, who)

    def drain(self, raise_error: bool = True) -> None:
        """Wait for the last write, stop the writer thread and free the host buffers
        (``train()`` returns only after this). With ``raise_error=False`` (``train()`` is
        raising already) a failed write is logged instead of raised."""
        try:
            self.wait("The end of train()")
            manifest.compact(self.directory)  # manifest.json alone lists every record again
        except Exception:
            if raise_error:
                raise
            log.exception("the checkpoint write in flight when training stopped failed")
        finally:
            if self._thread is not None:
                self._thread.shutdown(wait=True)
                self._thread = None
            if self._copier is not None:  # a finished run holds no copy of its state
                self._copier = HostCopier()

    def _add_point(self, point: manifest.Point) -> None:
        """Record a point no selector keeps: it still counts for Last/Best."""
        with store.manifest_lock(self.directory):
            manifest.commit(self.directory, points=[(self.run, point)])

    def _commit(
        self,
        reservation: store.Reservation,
        entry: ManifestEntry,
        point: manifest.Point,
        tensors: dict[str, torch.Tensor],
        meta: dict[str, Any],
    ) -> ManifestEntry | None:
        """Write the record, list it, apply retention; the reservation is released after."""
        try:
            size, digest = store.write_record(reservation, tensors, meta)
        except BaseException:
            store.remove_file(
                store.tmp_path(reservation.path)
            )  # no partial file outlives a failed save
            reservation.release()
            raise
        entry = entry.model_copy(
            update={"bytes": size, "digest": digest, "written": manifest.now_iso()}
        )
        try:
            with store.manifest_lock(self.directory):
                current = manifest.load(self.directory)
                current.entries.append(entry)
                plan = retention.plan(current.entries, self.ckpt, self.run, self.pair)
                doomed = set(plan.delete)
                manifest.commit(
                    self.directory, add=[entry], drop=doomed, points=[(self.run, point)]
                )
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
