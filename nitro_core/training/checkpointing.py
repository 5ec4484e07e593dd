"""The one record writer: the loop's collaborator that names, writes and commits records,
then carries out the retention plan, for a record file and a record directory alike.

Order of a save, so a crash at any point loses nothing that counted:
decide (from the manifest) -> claim the name (``-run-<id>`` inserted when another run has
it) -> write the record (its format's commit: tmp, fsync, rename) -> under the lock, add its
entry and drop evicted entries from the manifest -> delete the evicted files. A crash
before the manifest commit leaves an unlisted file that counts for nothing; a crash after
it leaves a deleted entry's file on disk, also unlisted. A point no selector keeps is only
added to the run's history.

What differs between the formats is a strategy (:class:`RecordFormat`): :class:`OneFile`
(one ``.safetensors`` file written by rank 0: one process, or DDP) and
:class:`~nitro_core.training.sharded_save.RecordDirectory` (FSDP: every rank writes its
shards of one directory). The entry, the naming, retention, the wait, the drain (which
compacts the journal) and the ranks' agreement on a failed write live here, once.

With ``Checkpointer(async_write=True)`` (the default) the training thread only decides,
claims the name and copies the state to host memory; the write, the manifest commit and the
retention run in the background. At most one write is in flight: the next point waits for
it (saying so in the log), and its error, if it failed, is raised there (on every rank) or
by :meth:`RecordWriter.drain` at the end of ``train()``, the same error a synchronous write
raises. The manifest lists a record only once it is durable.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from nitro_core.errors import NitroWarning, TrainingRefused
from nitro_core.policy import retention
from nitro_core.policy.retention import Pair
from nitro_core.policy.selectors import Checkpointer
from nitro_core.state import records
from nitro_core.state.hostcopy import HostCopier
from nitro_core.store import digest, manifest
from nitro_core.store import recordio as store
from nitro_core.store.manifest import ManifestEntry, StopReason, point_of
from nitro_core.store.run import RunStore
from nitro_core.training.distributed import Dist

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
_PLACEHOLDER_DIGEST = digest.TREE + ":" + "0" * 32
T = TypeVar("T")
Written = tuple[int, str]  # (bytes, the manifest's digest) of a durable record
Snap = Callable[[], records.Snapshot]
Submit = Callable[[Callable[[], T]], "Future[T]"]


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


def done(value: T) -> Future[T]:
    """A future that already holds ``value`` (a synchronous write's result)."""
    future: Future[T] = Future()
    future.set_result(value)
    return future


def then(first: Future[Any], step: Callable[[Any], T]) -> Future[T]:
    """The future of ``step(first's result)``, run in the thread that finishes ``first``
    (at once when it is done already); either's error ends it."""
    out: Future[T] = Future()

    def run(finished: Future[Any]) -> None:
        try:
            out.set_result(step(finished.result()))
        except BaseException as exc:  # raised by whoever waits for it
            out.set_exception(exc)

    first.add_done_callback(run)
    return out


class Claim(Protocol):
    """A record name held for this write (by rank 0, until the manifest lists it)."""

    path: Path

    def release(self) -> None: ...  # after the commit: the name is the manifest's now
    def abandon(self) -> None: ...  # after a failure: no partial record outlives it


class RecordFormat(Protocol):
    """What a record's format decides; :class:`RecordWriter` does the rest."""

    every_rank: bool  # every rank writes its part (a collective), or rank 0 alone
    suffix: str  # of a record's name
    taken: str  # why no candidate name could be claimed: the refusal's end, with {run}

    def claim(self, path: Path) -> Claim | None: ...  # rank 0, under the manifest lock
    def write(
        self, path: Path, claim: Claim | None, epoch: int, snapshot: Snap, submit: Submit[Any]
    ) -> Future[Written | None]: ...  # (bytes, digest) on rank 0 once the record is durable
    def close(self) -> None: ...  # a finished run holds no copy of its state


class RecordWriter:
    """Writes one run's records into ``directory`` under ``ckpt``'s keep rules, in ``format``.
    Held by every rank; rank 0 (``dist.main``) decides, names and commits."""

    def __init__(
        self,
        store: RunStore,
        ckpt: Checkpointer,
        run: str,
        pair: Pair,
        parent: str | None,
        dist: Dist,
        format: RecordFormat,
        since: int = 0,
    ) -> None:
        # records are written in ``store.local`` (on object storage its staging directory),
        # then published to the run directory (store.run)
        self.store, self.directory = store, store.local
        self.ckpt, self.run, self.pair = ckpt, run, pair
        self.parent, self.dist, self.format = parent, dist, format
        # the step this writer's timeline of the run starts at (a resumed record's, or 0),
        # and the files it listed: an entry of this run past ``since`` that this writer did
        # not list belongs to the timeline the resume replaced (object storage: a killed
        # writer's commit that reached the store late; a disk never lists one)
        self.since, self._listed = since, set[str]()
        self._listing: str | None = None  # the digest of the record being listed
        self._thread: ThreadPoolExecutor | None = None
        self._pending: Future[Any] | None = None
        self._pending_what = ""

    # -- a point --------------------------------------------------------------------------
    def save(
        self,
        epoch: int,
        step: int,
        score: float | None,
        stop_reason: StopReason | None,
        snapshot: Snap,
        batch: int | None = None,
    ) -> ManifestEntry | None:
        """Offer the point's record: write it if some selector keeps it (a collective when
        every rank writes). Returns its committed entry on rank 0 (None when nothing was
        kept, and always under ``async_write``: the write is then still in flight, and
        :meth:`wait` raises its error)."""
        where = f"epoch {epoch}" + (f" batch {batch}" if batch is not None else "")
        self._settle(f"The checkpoint point at {where} (step {step})")
        if not self.dist.main and not self.format.every_rank:
            return None  # rank 0 writes the record
        entry = self._entry(epoch, step, score, stop_reason, batch) if self.dist.main else None
        claim = self._decide(entry, where) if entry is not None else None
        name = claim.path.name if claim is not None else None
        if self.format.every_rank:
            name = self.dist.broadcast(name)
        if name is None:
            return None
        try:
            written = self.format.write(self.directory / name, claim, epoch, snapshot, self._submit)
        except BaseException:
            if claim is not None:
                claim.abandon()
            raise
        pending: Future[Any] = written
        if claim is not None and entry is not None:
            entry = entry.model_copy(update={"file": name})
            # on the writer's thread, after the format's write (queued first, or DCP's)
            pending = self._submit(lambda: self._commit(claim, entry, written.result()))
        if self.ckpt.async_write:
            self._pending, self._pending_what = pending, repr(name)
            return None
        committed: ManifestEntry | None = pending.result()
        if self.format.every_rank:
            self.dist.barrier()  # the next point reads a manifest that lists this record
        return committed

    def _entry(
        self,
        epoch: int,
        step: int,
        score: float | None,
        stop_reason: StopReason | None,
        batch: int | None,
    ) -> ManifestEntry:
        metric, mode = self.pair
        stem = record_name(epoch, step, score, metric, self.ckpt.name, batch).removesuffix(SUFFIX)
        return ManifestEntry(
            file=stem + self.format.suffix, epoch=epoch, batch=batch, step=step, score=score,
            metric=metric, mode=mode, stop_reason=stop_reason, run=self.run, parent=self.parent,
            written=manifest.now_iso(), keep=str(self.ckpt), bytes=0, digest=_PLACEHOLDER_DIGEST,
        )  # fmt: skip

    def _decide(self, entry: ManifestEntry, where: str) -> Claim | None:
        """Rank 0: the claimed name of a record some selector keeps, or None (the point is
        then only added to the run's history, in the background under ``async_write``)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        entries = self.store.entries()
        if not retention.would_keep(entries, entry, self.ckpt, self.run, self.pair):
            log.debug("%s not written: no selector of %s keeps it", where, self.ckpt)
            added = self._submit(lambda: self._add_point(entry))
            if self.ckpt.async_write:
                self._pending, self._pending_what = added, f"the point at {where}"
            else:
                added.result()
            return None
        with self.store.lock():  # a name a commit takes meanwhile: the upload moves past it
            return self._claim(entry.file, self.store.entries())

    def _claim(self, name: str, entries: list[ManifestEntry]) -> Claim:
        """Claim ``name``, or ``name`` with ``-run-<id>`` inserted when another run listed it
        or holds it right now."""
        listed = {e.file for e in entries}
        suffix = self.format.suffix
        stem = name.removesuffix(suffix) if suffix else name
        candidates = [name, f"{stem}-run-{self.run}{suffix}"]
        candidates += [
            f"{stem}-run-{self.run}-{k}{suffix}" for k in range(1, self.store.spare_names + 1)
        ]
        for candidate in candidates:
            if candidate in listed:
                continue
            claim = self.format.claim(self.directory / candidate)
            if claim is not None:
                return claim
        raise self.store.no_name(self.run, name, len(candidates), self.format.taken)

    # -- the commit (rank 0; on the writer's thread under async_write) ------------------------
    def _add_point(self, entry: ManifestEntry) -> None:
        """Record a point no selector keeps: it still counts for Last/Best."""
        self.store.add_point(self.run, point_of(entry))

    def _commit(
        self, claim: Claim, entry: ManifestEntry, written: Written | None
    ) -> ManifestEntry | None:
        """List the durable record, apply retention; the claim is released after."""
        assert written is not None  # rank 0's write returns the record's size and digest
        size, tree = written
        entry = entry.model_copy(
            update={"bytes": size, "digest": tree, "written": manifest.now_iso()}
        )
        self._listing = entry.digest
        try:
            listed = self.store.publish(
                self.directory / entry.file, entry, self._retention, sent=self.format.every_rank
            )
        finally:
            claim.release()
        if listed is not None:
            self._listed.add(listed.file)
        return listed

    def _retention(self, entries: list[ManifestEntry]) -> set[str]:
        """The files a commit unlists once ``entries`` are listed: records of the timeline a
        resume replaced, then what retention drops (this run's, by its keep) of the rest."""
        replaced = self._replaced(entries)
        kept = [e for e in entries if e.file not in replaced]
        return replaced | set(retention.plan(kept, self.ckpt, self.run, self.pair).delete)

    def _replaced(self, entries: list[ManifestEntry]) -> set[str]:
        """Entries of this run past the step this writer's timeline starts at that it did
        not list, nor is listing now (its digest): a killed writer's commit
        that the store applied after this resume read the manifest (a request sent whole
        before the kill). A disk never lists one: a killed writer commits nothing more. The
        resume replaced that timeline, as the run's points say (``Manifest.add_point``)."""
        replaced = {
            e.file
            for e in entries
            if e.run == self.run and e.step > self.since and e.file not in self._listed
            and e.digest != self._listing
        }  # fmt: skip
        if replaced:
            log.warning(
                "%s: unlisting %s, written by a killed process of run %s past step %d where "
                "this resume continued it (its commit reached the store after the resume "
                "read the manifest); this run's own record of that point is listed instead",
                self.store, sorted(replaced), self.run, self.since,
            )  # fmt: skip
        return replaced

    def _submit(self, job: Callable[[], T]) -> Future[T]:
        """Run ``job`` here (synchronous writes) or on the writer thread."""
        if not self.ckpt.async_write:
            out: Future[T] = Future()
            try:
                out.set_result(job())
            except BaseException as exc:
                out.set_exception(exc)
            return out
        if self._thread is None:
            # at the training thread's priority: a writer niced below it, on a CPU run whose
            # torch threads keep every core busy, was still writing at the next point, which
            # then waited for it (bench/async_write.py: 200 ms blocked a point, against 30)
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nitro-writer")
        return self._thread.submit(job)

    # -- waiting --------------------------------------------------------------------------
    def _settle(self, who: str = "") -> None:
        """Block until this rank's write in flight, if any, is done; raise its error. ``who``
        names the waiter in the log line saying it waits."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if not pending.done() and who:
            log.info("%s waits for the write of %s, still in flight", who, self._pending_what)
        pending.result()

    def wait(self, who: str = "") -> None:
        """Wait for the write in flight and raise its error, on every rank at once (a
        collective: every rank calls it at every point of a run that checkpoints, and at the
        end of its ``train()``): records are committed by rank 0 alone (DDP's whole record,
        FSDP's publish), so only rank 0 sees their errors, and the other ranks, going on,
        would wait for it in the next collective forever (or, past ``train()``, read a
        manifest that does not list the last record yet). Every rank says whether its write
        failed; those whose own did not raise the failed rank's words."""
        failed: Exception | None = None
        try:
            self._settle(who)
        except Exception as exc:
            failed = exc
        if not self.dist.active:
            if failed is not None:
                raise failed
            return
        said = self.dist.gather(None if failed is None else f"{type(failed).__name__}: {failed}")
        if failed is not None:
            raise failed
        for rank, words in enumerate(said):
            if words is not None:
                raise TrainingRefused(
                    f"Rank {rank}'s checkpoint write failed ({words}); every rank stops here. "
                    "The records listed in the manifest are intact: fix the cause, then "
                    "continue with resume='auto'."
                )

    def drain(self, raise_error: bool = True) -> None:
        """Wait for this rank's last write, compact the journal (rank 0), stop the writer
        thread and free the host buffers (``train()`` returns only after this). With
        ``raise_error=False`` (``train()`` is raising already) a failed write is logged
        instead of raised."""
        try:
            self._settle("The end of train()")
            if self.dist.main:
                self.store.compact()  # manifest.json alone lists every record again
        except Exception:
            if raise_error:
                raise
            log.exception("the checkpoint write in flight when training stopped failed")
        finally:
            if self._thread is not None:
                self._thread.shutdown(wait=True)
                self._thread = None
            self.format.close()


# -- one record file, written by rank 0 -------------------------------------------------------
class _Reserved:
    """A record file's claim: its ``.tmp`` reserved (:func:`nitro_core.store.recordio.reserve`)."""

    def __init__(self, reservation: store.Reservation) -> None:
        self.reservation = reservation
        self.path = reservation.path

    def release(self) -> None:
        self.reservation.release()

    def abandon(self) -> None:
        store.remove_file(store.tmp_path(self.path))  # no partial file outlives it
        self.reservation.release()


def _detached(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` sharing nothing the training thread changes while a background write reads
    it: a JSON copy, except the ``history``, whose list is copied but not its rows (a row
    never changes once appended), so a point's cost does not grow with the run's points."""
    copied = json.loads(json.dumps({k: v for k, v in meta.items() if k != "history"}))
    return {k: list(v) if k == "history" else copied[k] for k, v in meta.items()}


class OneFile:
    """A record as one ``.safetensors`` file, written by rank 0 alone. Under ``async_write``
    the training thread copies the state into reused host buffers
    (:class:`~nitro_core.state.hostcopy.HostCopier`) and the writer's thread writes them."""

    every_rank = False
    suffix = SUFFIX
    taken = (
        "another process is writing the same run's record right now. Train run {run} from "
        "one process at a time."
    )

    def __init__(self, async_write: bool) -> None:
        self._copier = HostCopier() if async_write else None

    def claim(self, path: Path) -> Claim | None:
        reservation = store.reserve(path)
        return None if reservation is None else _Reserved(reservation)

    def write(
        self, path: Path, claim: Claim | None, epoch: int, snapshot: Snap, submit: Submit[Any]
    ) -> Future[Written | None]:
        assert isinstance(claim, _Reserved)  # rank 0 writes, holding the name
        _warn_leftovers(path.parent, claim.reservation, epoch)
        if self._copier is None:
            tensors, meta = records.encode(snapshot())
        else:  # the training thread waits for the host copy only
            tensors, meta = records.encode(snapshot(), leaf=self._copier)
            self._copier.finish()
            meta = _detached(meta)  # nothing the training thread changes later
        return submit(lambda: self._write(claim, tensors, meta))

    def _write(self, claim: _Reserved, tensors: dict[str, Any], meta: dict[str, Any]) -> Written:
        try:
            return store.write_record(claim.reservation, tensors, meta)
        except BaseException:
            claim.abandon()  # no partial file outlives a failed save
            raise

    def close(self) -> None:
        if self._copier is not None:  # a finished run holds no copy of its state
            self._copier = HostCopier()


def _warn_leftovers(directory: Path, reservation: store.Reservation, epoch: int) -> None:
    """Say which leftovers of interrupted writes the reservation moved aside or reclaimed."""
    for moved in reservation.set_aside:
        warnings.warn(
            f"{moved.name.removesuffix('.stale')!r} in {str(directory)!r} was left by an "
            f"interrupted write and is listed by no manifest entry; moved it to "
            f"{moved.name!r} before writing epoch {epoch}.",
            NitroWarning,
            stacklevel=6,
        )
    if reservation.reclaimed:  # .stale files of writers now provably dead
        warnings.warn(
            store.describe_reclaimed(directory, reservation.reclaimed), NitroWarning, stacklevel=6
        )
