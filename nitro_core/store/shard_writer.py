"""The DCP storage writer of sharded records: each rank writes its pieces to one safetensors
shard on the layout of DCP's ``HuggingFaceStorageWriter`` (so DCP's
``HuggingFaceStorageReader`` and Nitro's readers read it), hashes the file it wrote, and
DCP's own gather hands every rank's digest to rank 0.

The shard, ``shard-<rank+1:05>-model-00001-of-00001.safetensors``: the 8-byte header length,
the JSON header (each piece's ``dtype``, ``shape`` and ``data_offsets``; ``__metadata__``
holds DCP's ``DCP_SHARDING_INFO``, each piece's ``saved_offsets`` in its whole tensor, with
``DCP_VERSION`` and ``format``), padded with spaces to 8 bytes, then the pieces' bytes,
largest element first then by name, so every piece starts at an offset its element size
divides. No ``.metadata`` pickle is written.

Why not ``HuggingFaceStorageWriter`` itself: it serializes a rank's whole shard into one
``bytes`` object (``safetensors.torch.save``) before writing it, a second copy of the shard
in fresh memory. Here each piece's bytes go from the tensor to the file, in 8 MiB writes.

Digests: the file's xxh3-128 is taken over the bytes written (header, then the pieces, from
the same host tensors), on a thread of this rank while the disk takes the data
(``fsync``), as :mod:`nitro_core.store.writer` does. Each rank returns it inside the
``WriteResult``\\ s of its ``write_data`` (:class:`ShardFile`); DCP gathers every rank's
results to the coordinator's ``finish``, which keeps them in :attr:`ShardWriter.digests` for
:func:`nitro_core.store.shards.publish`. So the ranks hash in parallel, and rank 0 never
reads another rank's shard back.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import xxhash
from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from nitro_core.errors import RecordError
from nitro_core.store.safeio import open_nofollow
from nitro_core.store.writer import DTYPES

_CHUNK = 8 * 1024 * 1024
SHARDING_KEY = "DCP_SHARDING_INFO"  # torch.distributed.checkpoint._hf_utils' keys
_VERSION = {"DCP_VERSION": "1.0", "format": "pt"}


def shard_name(shard_index: int) -> str:
    """The file DCP's ``HuggingFaceStorageWriter`` names rank ``shard_index - 1``'s shard."""
    return f"shard-{shard_index:05d}-model-00001-of-00001.safetensors"


@dataclasses.dataclass(frozen=True)
class ShardFile:
    """A ``WriteResult``'s storage data: where the piece lies in which file, and the digest
    of that whole file."""

    relative_path: str
    offset: int
    length: int
    digest: str


class ShardWriter(HuggingFaceStorageWriter):
    """Every rank writes its pieces to its own safetensors shard under ``path`` and hashes
    it; once ``dcp.save`` (or ``async_save``) has finished, the coordinator's :attr:`digests`
    name every shard file's xxh3-128 (``{file name: hex}``). Planning (one shard per rank,
    numbered from 1) and host staging for ``async_save`` are ``HuggingFaceStorageWriter``'s."""

    def __init__(self, path: str, upload: Callable[[Path], None] | None = None) -> None:
        super().__init__(path, save_distributed=True)
        self.digests: dict[str, str] = {}
        self.upload = upload  # object storage: the shard, written and hashed, is sent there

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        results: list[WriteResult] = []
        if plan.items:
            name = shard_name(plan.storage_data["shard_index"])
            results = _write_shard(Path(self.path) / name, plan, planner)
            if self.upload is not None:  # before DCP counts this rank's write done
                self.upload(Path(self.path) / name)
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """On the coordinator, with every rank's results: keep the digests; write nothing."""
        self.digests = {
            r.storage_data.relative_path: r.storage_data.digest for rank in results for r in rank
        }


def _write_shard(path: Path, plan: SavePlan, planner: SavePlanner) -> list[WriteResult]:
    pieces: dict[str, tuple[Any, torch.Tensor]] = {}
    for item in plan.items:
        fqn = item.index.fqn
        # shards.write refused anything but tensors of a storable dtype; a rank holds one
        # piece of each tensor (a second would overwrite the first: refused, never dropped)
        if item.type == WriteItemType.BYTE_IO or item.tensor_data is None or fqn in pieces:
            raise RecordError(
                f"Record leaf {fqn!r} came to this rank's shard writer as "
                f"{'a second piece' if fqn in pieces else 'bytes'}; a shard holds one piece of "
                "each tensor. Save the record through nitro_core.store.shards.write."
            )
        t = planner.resolve_data(item)
        if not isinstance(t, torch.Tensor):
            raise RecordError(f"Record leaf {fqn!r} resolved to {type(t).__name__}, not a tensor.")
        pieces[fqn] = (item, t.detach().cpu().contiguous())
    order = sorted(pieces, key=lambda n: (-pieces[n][1].element_size(), n))
    header, spans = _header(order, pieces)
    fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "wb") as f:
        f.write(header)
        for piece in _bytes(order, pieces):
            f.write(piece)
        f.flush()
        with ThreadPoolExecutor(max_workers=1) as pool:
            # the data goes to the disk while this thread hashes the same bytes from memory
            syncing = pool.submit(os.fsync, f.fileno())
            hasher = xxhash.xxh3_128(header)
            for piece in _bytes(order, pieces):
                hasher.update(piece)
            syncing.result()
    hexdigest = str(hasher.hexdigest())
    return [
        WriteResult(
            index=pieces[n][0].index,
            size_in_bytes=spans[n][1],
            storage_data=ShardFile(path.name, *spans[n], hexdigest),
        )
        for n in order
    ]


def _header(
    order: list[str], pieces: dict[str, tuple[Any, torch.Tensor]]
) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The shard's ``8-byte length + JSON header``, and each piece's (file offset, length)."""
    sharding = {n: {"saved_offsets": list(pieces[n][0].tensor_data.chunk.offsets)} for n in order}
    entries: dict[str, Any] = {"__metadata__": {SHARDING_KEY: json.dumps(sharding), **_VERSION}}
    sizes: dict[str, tuple[int, int]] = {}
    offset = 0
    for n in order:
        t = pieces[n][1]
        size = t.numel() * t.element_size()
        entries[n] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape)}
        entries[n]["data_offsets"] = [offset, offset + size]
        sizes[n] = (offset, size)
        offset += size
    head = json.dumps(entries, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    start = 8 + len(head)
    spans = {n: (start + at, size) for n, (at, size) in sizes.items()}
    return struct.pack("<Q", len(head)) + head, spans


def _bytes(order: list[str], pieces: dict[str, tuple[Any, torch.Tensor]]) -> Iterator[memoryview]:
    """Every piece's bytes in file order, in slices of at most 8 MiB."""
    for n in order:
        t = pieces[n][1]
        if t.numel() == 0:
            continue
        data = t.reshape(-1).view(torch.uint8).numpy().data.cast("B")
        for start in range(0, len(data), _CHUNK):
            yield data[start : start + _CHUNK]
