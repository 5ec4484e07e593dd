"""Sharded records: the record directory every rank of an FSDP run writes together,
through ``torch.distributed.checkpoint`` (DCP) and its safetensors storage layer.

Layout of ``<run_dir>/<name>/`` (the record's file name without ``.safetensors``)::

    shard-00001-model-00001-of-00001.safetensors   rank 0's pieces of the tensors
    shard-00002-model-00001-of-00001.safetensors   rank 1's, ... (each with its pieces'
                                                   offsets in its own safetensors metadata)
    header.json                                    the record's JSON header, written by rank 0

Every file is safetensors or JSON: DCP's ``.metadata`` pickle is never written (DCP's
``HuggingFaceStorageReader`` rebuilds its metadata from the shards' own headers), so
nothing is ever unpickled from a run directory.

Commit, so that a SIGKILL of any rank at any moment leaves the manifest and the records it
lists intact: every rank writes its shard into ``<name>.tmp/`` and hashes it
(:mod:`nitro_core.store.shard_writer`); DCP's save returns on rank 0 only after every rank's
files are written and fsynced, with every rank's digest; rank 0 then writes ``header.json``
(naming each shard's digest, no shard read back), fsyncs the directory, renames it to
``<name>``, fsyncs the run directory (:class:`~nitro_core.store.atomic.PublishDirectory`),
and only then lists the record in the manifest. A
``.tmp`` directory is never selected, loaded or resumed into.

Digests, the same hash tree as a record file's (:mod:`nitro_core.store.digest`):
``header.json`` names the xxh3-128 of every shard file (``"shards": {file: hex}``) and of
itself (``"integrity": {"header": hex}``, for a record no manifest lists), and the manifest's
``digest`` is ``xxh3-128-tree:`` and the xxh3-128 of ``header.json``'s bytes, so that one
value covers every byte of the directory; ``bytes`` is the files' sizes summed. A reader
checks ``header.json`` against the manifest when it lists the record (else against its own
digest), then that the directory holds exactly the shards it lists, as files, then every
shard against the header; a refusal names the file that differs.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import xxhash

from nitro_core.errors import CheckpointCorrupt, RecordError
from nitro_core.store import deleter, digest
from nitro_core.store.atomic import PublishDirectory
from nitro_core.store.record_header import Tensor
from nitro_core.store.record_header import (
    is_sharded as is_sharded,  # re-exported: the readers ask here
)
from nitro_core.store.safeio import open_nofollow
from nitro_core.store.shard_header import HEADER_NAME as HEADER_NAME  # re-exported
from nitro_core.store.shard_header import SHARD_NAME as SHARD_NAME  # re-exported
from nitro_core.store.shard_header import (
    checked_header,
    header_bytes,
)
from nitro_core.store.shard_header import read_header as read_header  # re-exported
from nitro_core.store.writer import DTYPES

SHARD_SUFFIX = ".safetensors"
_CHUNK = 8 * 1024 * 1024
_MAX_SHARD_HEADER = 100 * 1024 * 1024


Upload = Callable[[Path], None]  # a rank's shard, once written and hashed: sent to object storage


def _fresh(tmp: Path) -> None:
    """Rank 0 clears ``tmp`` of what a killed write left under this name and makes it anew.
    Another rank's DCP writer may have made it already (``prepare_local_plan`` does, on every
    rank, before the plans are gathered): that empty directory is fine, since no rank writes a
    byte before rank 0 joins the gather, so ``exist_ok``."""
    remove_tree(tmp)
    tmp.mkdir(parents=True, exist_ok=True)


def write(
    tmp: Path, tensors: Mapping[str, torch.Tensor], main: bool, upload: Upload | None = None
) -> dict[str, str]:
    """Every rank's part of ``tensors`` (DTensors: each rank's pieces; plain tensors: one
    copy, written by one rank) into ``tmp`` through DCP. A collective: every rank calls it
    with the same ``tmp``; on rank 0 it returns, once every rank's files are durable, the
    digest each rank took of the shard it wrote (``{file name: xxh3-128 hex}``, for
    :func:`publish`); on the other ranks, ``{}``."""
    from torch.distributed.checkpoint.state_dict_saver import save

    from nitro_core.store.shard_writer import ShardWriter  # lazy: DCP is heavy to import

    _check_tensors(tensors)
    if main:
        _fresh(tmp)
    writer = ShardWriter(str(tmp), upload)
    save(dict(tensors), storage_writer=writer, planner=_rank_0_writes_plain())
    return dict(writer.digests)


def write_async(
    tmp: Path,
    tensors: Mapping[str, torch.Tensor],
    main: bool,
    group: Any,
    upload: Upload | None = None,
) -> Future[dict[str, str]]:
    """:func:`write` in the background: DCP's ``async_save`` copies this rank's tensors to
    host memory, returns, and writes them on a thread whose collectives run over ``group``
    (a process group of their own). The future ends, on rank 0 once every rank's files are
    durable, with :func:`write`'s digests."""
    from torch.distributed.checkpoint.state_dict_saver import async_save

    from nitro_core.store.shard_writer import ShardWriter  # lazy: DCP is heavy to import

    _check_tensors(tensors)
    if main:
        _fresh(tmp)
    writer = ShardWriter(str(tmp), upload)
    saved = async_save(
        dict(tensors), storage_writer=writer, planner=_rank_0_writes_plain(), process_group=group
    )
    assert isinstance(saved, Future)  # the thread checkpointer returns a plain future
    digests: Future[dict[str, str]] = Future()

    def done(finished: Future[Any]) -> None:
        try:
            finished.result()
        except BaseException as exc:
            digests.set_exception(exc)
        else:
            digests.set_result(dict(writer.digests))

    saved.add_done_callback(done)
    return digests


def _rank_0_writes_plain() -> Any:
    """DCP's planner, writing each plain (not DTensor) tensor from rank 0's copy: a rank's
    generators and data position are plain tensors that differ between ranks, and the
    record's ``rng/`` must be rank 0's, as its header is (DCP's default writes each from
    whichever rank has written the least so far)."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    return DefaultSavePlanner(dedup_save_to_lowest_rank=True)


def _check_tensors(tensors: Mapping[str, Any]) -> None:
    """Refuse, on every rank before any collective, a leaf the shards cannot hold (raised
    inside DCP's write, the error would reach the caller wrapped in DCP's own)."""
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise RecordError(
                f"Record leaf {name!r} is of type {type(value).__name__}, not a tensor; a "
                "sharded record holds tensors only (put other values in the record's JSON "
                "header)."
            )
        if value.dtype not in DTYPES:
            raise RecordError(
                f"Record leaf {name!r} has dtype {value.dtype}, which safetensors cannot store; "
                f"convert it to one of {sorted(str(d) for d in DTYPES)}."
            )


def publish(
    tmp: Path, final: Path, meta: Mapping[str, Any], digests: Mapping[str, str]
) -> tuple[int, str]:
    """Rank 0, after :func:`write`: add ``header.json`` naming each shard's ``digests`` (as
    :func:`write` returned them: each rank hashed its own), make the directory durable and
    rename it into place; returns (bytes, the manifest's digest)."""
    present = sorted(p.name for p in tmp.iterdir() if p.name != HEADER_NAME)
    if present != sorted(digests):
        raise CheckpointCorrupt(
            f"Record directory {str(tmp)!r} holds the files {present}, the ranks wrote "
            f"{sorted(digests)}; another process wrote into it. Save the record again."
        )
    raw = header_json(meta, digests)
    PublishDirectory(final, tmp, HEADER_NAME).commit(lambda f: f.write(raw))
    return _sizes(final), digest.tree(raw)


def header_json(meta: Mapping[str, Any], digests: Mapping[str, str]) -> bytes:
    """``header.json``'s bytes: the record's header naming each shard's digest, sealed with
    its own digest (``integrity.header``)."""
    header = {k: v for k, v in meta.items() if k != digest.KEY}
    header["shards"] = dict(sorted(digests.items()))
    return digest.sealed_json_header(header)


def manifest_digest(path: Path) -> str:
    """The manifest's digest of a record directory: the hash of its ``header.json``."""
    return digest.tree(header_bytes(path))


def _sizes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def _file_digest(path: Path) -> str:
    hasher = xxhash.xxh3_128()
    with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as f:
        while block := f.read(_CHUNK):
            hasher.update(block)
    return str(hasher.hexdigest())


def verify(path: Path, expected: str | None, part: tuple[int, int] = (0, 1)) -> list[str]:
    """Check a record directory: ``header.json`` against the manifest's digest (when it
    lists the record) or its own, the files present against the shards it lists (none
    missing, none added, none a link), then every shard against the digest the header gives
    it; raise :class:`CheckpointCorrupt` naming the file that differs
    (:class:`CheckpointMissing` without ``header.json``). ``part=(rank, world)``: hash only
    every ``world``-th shard file from ``rank`` on (the ranks of a job share the work).
    Returns the sections of the record's tensors (from the shards' own headers)."""
    path = Path(path)
    header = checked_header(path, expected)
    shards = header.get("shards")
    if not isinstance(shards, dict) or not all(isinstance(v, str) for v in shards.values()):
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r}: its {HEADER_NAME} lists no shards ('shards' is "
            f"{_clip(shards)}). Load another checkpoint."
        )
    odd = sorted(name for name in shards if not SHARD_NAME.fullmatch(name))
    if odd:
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r}: its {HEADER_NAME} lists the shard {_clip(odd[0])}, "
            "which is not a shard file name (shard-NNNNN-model-NNNNN-of-NNNNN.safetensors, in "
            "the record directory itself); the header was edited, or not written by Nitro. "
            "Load another checkpoint."
        )
    with os.scandir(path) as it:
        present = {e.name: e for e in it if e.name != HEADER_NAME}
    missing = sorted(set(shards) - set(present))
    if missing:
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r} is missing the shard {missing[0]!r} its {HEADER_NAME} "
            f"lists ({len(missing)} of {len(shards)} shard files missing). Load another "
            "checkpoint."
        )
    extra = sorted(set(present) - set(shards))
    if extra:
        raise CheckpointCorrupt(
            f"Checkpoint {str(path)!r} holds {extra[0]!r}, which its {HEADER_NAME} does not "
            f"list ({len(extra)} file(s) added since it was written). Load another checkpoint."
        )
    for name in sorted(shards):
        if not present[name].is_file(follow_symlinks=False):
            if present[name].is_symlink():
                raise CheckpointCorrupt(
                    f"Checkpoint {str(path)!r}: shard {name!r} is a symbolic link, not the file "
                    "its rank wrote; Nitro never reads a shard through a link (it could lead "
                    "outside the run directory). Load another checkpoint."
                )
            kind = (
                "a directory"
                if present[name].is_dir(follow_symlinks=False)
                else "not a regular file (a FIFO or a device)"
            )
            raise CheckpointCorrupt(
                f"Checkpoint {str(path)!r}: shard {name!r} is {kind}, not the file its rank "
                "wrote. Load another checkpoint."
            )
    rank, world = part
    sections: set[str] = set()
    for name, value in sorted(shards.items())[rank::world]:
        if (actual := _file_digest(path / name)) != value:
            raise _differs(path, name, actual, shards)
    for name in sorted(shards):
        sections |= _shard_sections(path / name)
    return sorted(sections)


def _differs(path: Path, name: str, actual: str, shards: Mapping[str, str]) -> CheckpointCorrupt:
    """The refusal of shard ``name``, whose bytes digest to ``actual``: saying what it holds
    when that can be told (another shard's bytes, or fewer or more than its own header
    describes)."""
    other = next((n for n, v in sorted(shards.items()) if v == actual and n != name), None)
    if other is not None:
        return CheckpointCorrupt(
            f"Checkpoint {str(path)!r}: shard {name!r} holds the bytes of shard {other!r} (the "
            "shard files were swapped or copied over each other since they were written). "
            "Load another checkpoint."
        )
    size, described = _shard_extent(path / name)
    if described is not None and size != described:
        how = (
            f"is truncated: it ends {described - size} bytes short of"
            if size < described
            else f"has {size - described} bytes past the end"
        )
        return CheckpointCorrupt(
            f"Checkpoint {str(path)!r}: shard {name!r} {how} what its safetensors header "
            "describes. Load another checkpoint."
        )
    return CheckpointCorrupt(
        f"Checkpoint {str(path)!r}: shard {name!r} does not match the digest its "
        "header gives; it changed since it was written. Load another checkpoint."
    )


def _shard_head(path: Path) -> tuple[int, dict[str, Any] | None, int]:
    """(file size, the shard's safetensors header or None when unreadable, header bytes)."""
    with os.fdopen(open_nofollow(path, os.O_RDONLY), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        first = f.read(8)
        if len(first) < 8:
            return size, None, 0
        n = int.from_bytes(first, "little")
        if n > _MAX_SHARD_HEADER or 8 + n > size:
            return size, None, 0
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return size, None, 0
    return size, header if isinstance(header, dict) else None, 8 + n


def _shard_extent(path: Path) -> tuple[int, int | None]:
    """(the shard's size, the size its safetensors header describes, or None)."""
    size, header, start = _shard_head(path)
    if header is None:
        return size, None
    ends = [
        v["data_offsets"][1]
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict) and isinstance(v.get("data_offsets"), list)
    ]
    return size, start + max(ends, default=0)


def _shard_sections(path: Path) -> set[str]:
    """The sections of the tensors a (verified) shard holds."""
    _, header, _ = _shard_head(path)
    return {digest.section_of(k) for k in header or {} if k != "__metadata__"}


def _clip(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "…"


def read(
    path: Path, expected: str | None = None, want: Callable[[str], bool] | None = None
) -> dict[str, torch.Tensor]:
    """The record's tensors (those ``want`` selects), whole, in this one process: DCP
    assembles each from the shards' pieces. Checked first (:func:`verify`)."""
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    verify(path, expected)
    metadata = HuggingFaceStorageReader(str(path)).read_metadata()
    out = {
        name: torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for name, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata) and (want is None or want(name))
    }
    if out:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            load(out, storage_reader=HuggingFaceStorageReader(str(path)), no_dist=True)
    return out


def stream(
    path: Path, expected: str | None, want: Callable[[str], bool]
) -> Iterator[tuple[str, list[int], int, torch.Tensor]]:
    """The wanted tensors as :func:`nitro_core.store.recordio.stream_chunks` yields them
    (one piece each: a sharded record is assembled tensor by tensor)."""
    for name, tensor in read(path, expected, want).items():
        yield name, list(tensor.shape), 0, tensor.reshape(-1)


def remove_tree(path: Path) -> None:
    """Delete a record directory (gone already is fine; a link is unlinked, not followed),
    through the one deleter."""
    deleter.remove(path)


def _named(target: str) -> Callable[[str], bool]:
    return lambda name: name == target


class ShardedRecord:
    """A record directory opened as :class:`~nitro_core.store.reader.RecordFile` opens a
    file (``meta``, ``tensors``, ``read``, ``stream``, ``verify``, ``close``), for readers that
    take either: every tensor is assembled whole by DCP from the shards' pieces, in this one
    process. Opening checks ``header.json`` against ``expected`` and every shard against the
    header."""

    def __init__(self, path: Path, expected: str | None = None) -> None:
        from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self.path = Path(path)
        verify(self.path, expected)
        self.meta = read_header(self.path)
        metadata = HuggingFaceStorageReader(str(self.path)).read_metadata()
        self.tensors = []
        for name, md in sorted(metadata.state_dict_metadata.items()):
            if isinstance(md, TensorStorageMetadata):
                shape = tuple(int(s) for s in md.size)
                count = 1
                for s in shape:
                    count *= s
                size = count * torch.empty((), dtype=md.properties.dtype).element_size()
                self.tensors.append(
                    Tensor(
                        name, DTYPES[md.properties.dtype], shape, 0, size, digest.section_of(name)
                    )
                )

    def read(self, sections: Any = None) -> dict[str, torch.Tensor]:
        wanted = None if sections is None else set(sections)
        return read(
            self.path, None, None if wanted is None else (lambda n: digest.section_of(n) in wanted)
        )

    def stream(
        self,
        sections: Any = None,
        piece_bytes: int = 4 * 1024 * 1024,
        hasher: Any = None,
        order: Sequence[str] | None = None,
    ) -> Iterator[tuple[Any, int, torch.Tensor]]:
        """``(tensor, first element, flat piece)`` in name order, or in ``order`` (the
        names, as a record file beside it yields them), cut as a file's are. One tensor is
        assembled at a time (read records side by side hold one tensor each). ``hasher`` is
        :meth:`RecordFile.stream`'s and unused: DCP reads each tensor whole."""
        wanted = None if sections is None else set(sections)
        tensors = self.tensors
        if order is not None:
            by_name = {t.name: t for t in self.tensors}
            tensors = [by_name[name] for name in order if name in by_name]
        for t in tensors:
            if wanted is not None and t.section not in wanted:
                continue
            flat = read(self.path, None, _named(t.name))[t.name].reshape(-1)
            width = flat.element_size()
            step = max(1, (piece_bytes - piece_bytes % width) // width)
            if flat.numel() == 0:
                yield t, 0, flat
            for first in range(0, flat.numel(), step):
                yield t, first, flat[first : first + step]

    def verify(self) -> None:
        verify(self.path, None)

    def prefetch(self, sections: Any = None) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> ShardedRecord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
