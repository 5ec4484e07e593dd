"""A checkpoint point's record under FSDP: every rank writes its shards of one record
directory together (:mod:`nitro_core.store.shards`); rank 0 decides, names and commits.

Order, so that a SIGKILL of any rank at any moment loses nothing that counted: rank 0
decides from the manifest whether a selector keeps the point (a point no selector keeps is
only added to the run's history) and names the record; every rank learns the decision
(broadcast), writes its shards into ``<name>.tmp/`` and hashes the shard it wrote (DCP; on
rank 0 it returns once every rank's files are durable, with every rank's digest); rank 0
publishes the directory, then, under the manifest lock, lists it, applies retention and
deletes what retention dropped.

With ``async_write`` (the default) the shards are copied to host memory and written in
the background (:class:`ShardedWriter`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from nitro_core.errors import TrainingRefused
from nitro_core.policy import retention
from nitro_core.state import records
from nitro_core.store import digest, manifest, shards
from nitro_core.store import recordio as store
from nitro_core.store.manifest import ManifestEntry, StopReason
from nitro_core.training.checkpointing import SUFFIX, record_name, wait_for

if TYPE_CHECKING:
    from nitro_core.training.handle import Nitro

log = logging.getLogger(__name__)


def live_leaf(name: str, t: Any) -> Any:
    """Record tensors as they are: a DTensor keeps its sharding, which DCP writes."""
    return t.detach()


class ShardedWriter:
    """The FSDP counterpart of :class:`~nitro_core.training.checkpointing.CheckpointWriter`,
    held by every rank: the same ``save``/``wait``/``drain``.

    ``Checkpointer(async_write=True)``: DCP's ``async_save`` copies each rank's shards to
    host memory and returns; the files are written on a background thread over a process
    group of its own (``Dist.checkpoint_group``, so its collectives never interleave with
    training's), and rank 0 publishes and commits once DCP's save has finished on every
    rank. One write in flight: the next point, and the end of ``train()``, wait for it and
    raise its error."""

    def __init__(self, n: Nitro) -> None:
        self.n = n
        self._pending: Future[Any] | None = None
        self._what = ""

    def save(
        self,
        epoch: int,
        step: int,
        score: float | None,
        stop_reason: StopReason | None,
        snapshot: Callable[[], records.Snapshot],
        batch: int | None = None,
    ) -> None:
        """Offer the point's record (a collective: every rank calls it at every point)."""
        n = self.n
        where = f"epoch {epoch}" + (f" batch {batch}" if batch is not None else "")
        self.wait(f"The checkpoint point at {where} (step {step})")
        decision = _decide(n, epoch, step, score, stop_reason, batch) if n.dist.main else None
        decision = n.dist.broadcast(decision)
        if decision is None:
            return
        entry = ManifestEntry.model_validate(decision)
        tensors, meta = records.encode(snapshot(), leaf=live_leaf)
        final = n.run_dir / entry.file
        tmp = store.tmp_path(final)
        assert n.checkpointer is not None
        if not n.checkpointer.async_write:
            digests = shards.write(tmp, tensors, n.dist.main)
            if n.dist.main:
                _commit(n, entry, tmp, meta, digests)
            n.dist.barrier()  # the next point reads a manifest that lists this record
            return
        written = shards.write_async(tmp, tensors, n.dist.main, n.dist.checkpoint_group)
        if n.dist.main:
            committed: Future[Any] = Future()

            def commit(done: Future[Any]) -> None:
                try:
                    _commit(n, entry, tmp, meta, done.result())
                except BaseException as exc:  # raised at the next point, or by drain()
                    committed.set_exception(exc)
                else:
                    committed.set_result(None)

            written.add_done_callback(commit)
            self._pending = committed
        else:
            self._pending = written
        self._what = repr(entry.file)

    def wait(self, who: str = "") -> None:
        """Block until this rank's write in flight (and, on rank 0, its commit) is done;
        raise its error."""
        pending, self._pending = self._pending, None
        wait_for(pending, self._what, who)

    def drain(self, raise_error: bool = True) -> None:
        try:
            self.wait("The end of train()")
        except Exception:
            if raise_error:
                raise
            log.exception("the checkpoint write in flight when training stopped failed")


def _decide(
    n: Nitro,
    epoch: int,
    step: int,
    score: float | None,
    stop_reason: StopReason | None,
    batch: int | None,
) -> dict[str, Any] | None:
    ckpt = n.checkpointer
    assert ckpt is not None
    n.run_dir.mkdir(parents=True, exist_ok=True)
    metric, mode = n.ranking.pair
    name = record_name(epoch, step, score, metric, ckpt.name, batch).removesuffix(SUFFIX)
    entry = ManifestEntry(
        file=name, epoch=epoch, batch=batch, step=step, score=score, metric=metric, mode=mode,
        stop_reason=stop_reason, run=n.run_id, parent=n.parent, written=manifest.now_iso(),
        keep=str(ckpt), bytes=0, digest=digest.TREE + ":" + "0" * 32,
    )  # fmt: skip
    point = manifest.Point(
        epoch=epoch, batch=batch, step=step, score=score, metric=metric, mode=mode
    )
    with store.manifest_lock(n.run_dir):
        current = manifest.load(n.run_dir)
        if not retention.would_keep(current.entries, entry, ckpt, n.run_id, n.ranking.pair):
            manifest.commit(n.run_dir, points=[(n.run_id, point)])
            return None
        listed = {e.file for e in current.entries}
        for candidate in (name, f"{name}-run-{n.run_id}"):
            if candidate not in listed and not (n.run_dir / candidate).exists():
                return entry.model_copy(update={"file": candidate}).model_dump(mode="json")
    raise TrainingRefused(
        f"Run {n.run_id} cannot write {name!r} in {str(n.run_dir)!r}: the name and its "
        "run-suffixed form are taken by unlisted files. Move them out of the run directory."
    )


def _commit(
    n: Nitro, entry: ManifestEntry, tmp: Any, meta: dict[str, Any], digests: dict[str, str]
) -> None:
    ckpt = n.checkpointer
    assert ckpt is not None
    final = n.run_dir / entry.file
    size, tree = shards.publish(tmp, final, meta, digests)
    entry = entry.model_copy(update={"bytes": size, "digest": tree, "written": manifest.now_iso()})
    point = manifest.Point(
        epoch=entry.epoch, batch=entry.batch, step=entry.step, score=entry.score,
        metric=entry.metric, mode=entry.mode,
    )  # fmt: skip
    with store.manifest_lock(n.run_dir):
        current = manifest.load(n.run_dir)
        current.entries.append(entry)
        plan = retention.plan(current.entries, ckpt, n.run_id, n.ranking.pair)
        manifest.commit(n.run_dir, add=[entry], drop=set(plan.delete), points=[(n.run_id, point)])
        for file in plan.delete:
            store.remove_file(n.run_dir / file)
