"""A record directory under FSDP, the sharded format of the one record writer
(:class:`~nitro_core.training.checkpointing.RecordWriter`): every rank writes its shards of
one record directory together (:mod:`nitro_core.store.shards`); rank 0 decides, names and
commits, as for a record file.

Order, so that a SIGKILL of any rank at any moment loses nothing that counted: rank 0
decides from the manifest whether a selector keeps the point and names the record; every
rank learns the name (broadcast), writes its shards into ``<name>.tmp/`` and hashes the
shard it wrote (DCP; on rank 0 it returns once every rank's files are durable, with every
rank's digest); rank 0 publishes the directory, then, under the manifest lock, lists it,
applies retention and deletes what retention dropped.

``Checkpointer(async_write=True)``: DCP's ``async_save`` copies each rank's shards to host
memory and returns; the files are written on a background thread over a process group of
its own (``Dist.checkpoint_group``, so its collectives never interleave with training's),
and rank 0 publishes and commits once DCP's save has finished on every rank.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

from nitro_core.state import records
from nitro_core.store import recordio as store
from nitro_core.store import shards
from nitro_core.store.run import RunStore
from nitro_core.training.checkpointing import Claim, Snap, Submit, Written, done, then
from nitro_core.training.distributed import Dist


def live_leaf(name: str, t: Any) -> Any:
    """Record tensors as they are: a DTensor keeps its sharding, which DCP writes."""
    return t.detach()


class _Named:
    """A record directory's claim: a name no file or directory holds yet."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def release(self) -> None:
        pass

    def abandon(self) -> None:
        pass  # a killed or failed write's ``.tmp/`` is removed by the next write of the name


class RecordDirectory:
    """A record as a directory of safetensors shards, one per rank, and ``header.json``."""

    every_rank = True
    suffix = ""
    taken = (
        "the name and its run-suffixed form are taken by unlisted files. Move them out of the "
        "run directory."
    )

    def __init__(self, dist: Dist, async_write: bool, store: RunStore, run: str = "") -> None:
        self.dist = dist
        self.async_write = async_write
        self.run = run  # the run whose writer claims the name
        # where the shards go: on object storage each rank sends its shard under the
        # record's fresh prefix as soon as it is written and hashed, then rank 0 seals it
        self.store = store

    def claim(self, path: Path) -> Claim | None:
        if path.exists() or not self.store.claim(path.name, self.run):
            return None  # a file, or objects under this name (a killed write's, a claim)
        return _Named(path)

    def write(
        self, path: Path, claim: Claim | None, epoch: int, snapshot: Snap, submit: Submit[Any]
    ) -> Future[Written | None]:
        tensors, meta = records.encode(snapshot(), leaf=live_leaf)
        tmp, main = store.tmp_path(path), self.dist.main
        upload = self.store.shard_sender(path.name)
        written: Future[dict[str, str]]
        if self.async_write:
            group = self.dist.checkpoint_group
            written = shards.write_async(tmp, tensors, main, group, upload)
        else:
            written = done(shards.write(tmp, tensors, main, upload))
        if not main:
            return then(written, lambda _: None)  # rank 0 publishes
        return then(written, lambda digests: self.store.seal(tmp, path, meta, digests))

    def close(self) -> None:
        pass
