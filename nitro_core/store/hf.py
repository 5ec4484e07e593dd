"""Hugging Face model directories: the layout ``transformers``' ``save_pretrained`` writes and
``from_pretrained`` reads, read for ``weights="hf:<dir>"`` and written by ``export_hf``.

A directory holds ``config.json`` and its weights as one ``model.safetensors`` or as shards
``model-0000k-of-0000n.safetensors`` named by ``model.safetensors.index.json``::

    {"metadata": {"total_size": <bytes of every tensor>}, "weight_map": {"<key>": "<shard>"}}

Nitro writes every shard through the one record writer (so each carries ``"format": "pt"``
and its own section digests) into a fresh temporary directory beside the name, and
publishes the directory whole with :class:`~nitro_core.store.atomic.PublishDirectory`
(``new=True``: an existing name is refused, never replaced); ``nitro_provenance.json``, which
names each shard's digest, is the commit's last file. A reader loads the shards the index
names, by key; a shard Nitro wrote is verified against its own header's digests. Nothing is
unpickled: a directory that holds only ``pytorch_model.bin`` is refused.

The temporary is ``<out_dir>.tmp-XXXXXXXX`` (``mkdtemp``'s suffix: two writers of one name
never share one), held ``flock``-ed by its writer from its creation to its end. A writer
killed before publishing leaves it behind, unlocked: like a record's ``.tmp`` it is never
loaded (``hf:`` refuses it), and the next ``export_hf`` to the same ``out_dir`` removes it
before writing; a temporary whose writer is alive (locked) is left alone.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from nitro_core.errors import (
    CheckpointMissing,
    CheckpointNotFound,
    ConfigError,
    RecordError,
    UnsafePath,
)
from nitro_core.store import deleter, safeio
from nitro_core.store.atomic import TMP_SUFFIX, PublishDirectory, Replace
from nitro_core.store.record_header import MAX_HEADER, META_KEY, unreadable
from nitro_core.store.recordio import read_record, write_record

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
PROVENANCE = "nitro_provenance.json"
_LEFTOVER = re.compile(r"(.+)\.tmp-[a-z0-9_]{8}")  # <out_dir>.tmp- and mkdtemp's suffix
_SIZE = re.compile(r"\s*(\d+)\s*([KMGT]i?B|B)?\s*", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


def parse_size(value: int | str) -> int:
    """Bytes from ``max_shard_size`` as transformers takes it: an int, or ``"5GB"``,
    ``"500MB"``, ``"2GiB"`` (GB = 10**9, GiB = 2**30)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if m is None or int(m.group(1)) <= 0:
        raise ConfigError(
            f"max_shard_size={value!r} is not a size; write a positive number of bytes or a "
            "string such as '5GB', '500MB' or '2GiB'."
        )
    return int(m.group(1)) * _UNITS[(m.group(2) or "B").upper()]


def shard_plan(tensors: Mapping[str, torch.Tensor], max_bytes: int) -> list[list[str]]:
    """Keys in shards of at most ``max_bytes`` each, in key order, as transformers splits
    them: a new shard starts when the next tensor would overflow the current one (a tensor
    larger than ``max_bytes`` gets a shard of its own)."""
    shards: list[list[str]] = []
    size = 0
    for key in tensors:
        nbytes = tensors[key].numel() * tensors[key].element_size()
        if not shards or (size + nbytes > max_bytes and shards[-1]):
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes
    return shards or [[]]


def shard_name(k: int, n: int) -> str:
    return SINGLE if n == 1 else f"model-{k:05d}-of-{n:05d}.safetensors"


@dataclass(frozen=True)
class Written:
    """What :func:`write_dir` published: the directory, and each shard's digest."""

    path: Path
    shards: dict[str, str]  # file name -> the manifest's digest of it (xxh3-128-tree:...)
    total_size: int


def write_dir(
    out_dir: Path,
    tensors: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    provenance: Mapping[str, Any],
    max_bytes: int,
) -> Written:
    """Write a Hugging Face directory at ``out_dir`` (which must not exist) in one commit:
    ``config.json``, the shards (and the index when there are several), then
    ``nitro_provenance.json`` with ``provenance`` and the shards' digests. Nothing is left
    under ``out_dir`` or beside it when this raises."""
    out_dir = Path(out_dir)
    refuse_existing_dir(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    clear_leftovers(out_dir)
    tmp, lock = _claimed_tmp(out_dir)
    try:
        plan = shard_plan(tensors, max_bytes)
        digests: dict[str, str] = {}
        weight_map: dict[str, str] = {}
        for k, keys in enumerate(plan, 1):
            name = shard_name(k, len(plan))
            shard = {key: tensors[key] for key in keys}
            _, digests[name] = write_record(tmp / name, shard, {"kind": "hf-shard"})
            weight_map.update(dict.fromkeys(keys, name))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        if len(plan) > 1:
            index = {
                "metadata": {"total_size": total},
                "weight_map": dict(sorted(weight_map.items())),
            }
            _write_json(tmp / INDEX, index)
        _write_json(tmp / CONFIG, config)
        body = {**provenance, "shards": digests}
        raw = (json.dumps(body, indent=2, allow_nan=False) + "\n").encode()
        PublishDirectory(out_dir, tmp, PROVENANCE, new=True).commit(lambda f: f.write(raw))
    except BaseException:
        deleter.remove(tmp)
        raise
    finally:
        os.close(lock)  # the lock drops after the rename (or the removal)
    return Written(out_dir, digests, total)


def is_leftover(directory: Path) -> bool:
    """Whether ``directory`` is named as an ``export_hf`` temporary: ``<out_dir>.tmp-XXXXXXXX``."""
    return _LEFTOVER.fullmatch(Path(directory).name) is not None


def clear_leftovers(out_dir: Path) -> list[Path]:
    """Remove the temporaries that killed writers of ``out_dir`` left beside it (a directory
    named ``<out_dir>.tmp-XXXXXXXX`` that no live writer holds locked); returns them."""
    removed = []
    prefix = f"{out_dir.name}{TMP_SUFFIX}-"
    for path in sorted(out_dir.parent.glob(glob.escape(prefix) + "*")):
        found = _LEFTOVER.fullmatch(path.name)
        if found is None or found.group(1) != out_dir.name:
            continue  # not a temporary of this name (e.g. 'hf.tmp-mine'): never touched
        fd = _open_dir(path)
        if fd is None:
            continue  # a link, a file, or gone meanwhile
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its writer is alive
            if _held_at(fd, path):
                deleter.remove(path)
                removed.append(path)
        finally:
            os.close(fd)
    if removed:
        safeio.fsync_dir(out_dir.parent)
    return removed


def _claimed_tmp(out_dir: Path) -> tuple[Path, int]:
    """A new temporary directory beside ``out_dir`` and the open descriptor that holds it
    locked. Another writer clearing leftovers may lock and remove it in the instant between
    ``mkdtemp`` and ``flock``: then a new one is made."""
    for _ in range(8):
        tmp = Path(tempfile.mkdtemp(prefix=f"{out_dir.name}{TMP_SUFFIX}-", dir=out_dir.parent))
        fd = _open_dir(tmp)
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits while a clearing writer holds it
            if _held_at(fd, tmp):
                os.chmod(tmp, 0o755)  # mkdtemp's 0o700 would carry over to the published one
                return tmp, fd
            os.close(fd)
    raise ConfigError(
        f"out_dir {str(out_dir)!r}: other processes removed each temporary directory this "
        "export made beside it; nothing was written. Run one export_hf to that out_dir at a time."
    )


def _open_dir(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None


def _held_at(fd: int, path: Path) -> bool:
    """Whether the directory open as ``fd`` is still the one at ``path``."""
    held = os.fstat(fd)
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    raw = (json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()
    Replace(path).commit(lambda f: f.write(raw))


def refuse_existing_dir(out_dir: Path) -> None:
    if os.path.lexists(out_dir):
        raise ConfigError(
            f"out_dir {str(out_dir)!r} already exists; export_hf never writes into or over it. "
            f"Choose a new directory, e.g. out_dir={str(out_dir.with_name(out_dir.name + '-2'))!r}, "
            "or delete the old one first."
        )


# -- reading --------------------------------------------------------------------------------
def weight_files(directory: Path, shown: str) -> dict[str, list[str]]:
    """Shard file name -> the keys it holds, from the index (or the one ``model.safetensors``),
    refusing a directory that is missing or holds no safetensors weights. ``shown`` is the
    source as the caller wrote it."""
    if not directory.is_dir():
        raise CheckpointNotFound(
            f"Source {shown!r} names no Hugging Face directory: {str(directory)!r} "
            f"{'is a file' if directory.exists() else 'does not exist'}. Write hf: and a "
            "directory that save_pretrained() or export_hf() wrote, e.g. 'hf:models/gpt2-tiny'."
        )
    if is_leftover(directory):
        raise CheckpointNotFound(
            f"Source {shown!r} is the temporary directory of an export_hf that did not finish "
            "(a killed writer's), which Nitro never loads; the next export_hf to that out_dir "
            "removes it. Write hf: and the published directory, or run export_hf again."
        )
    if _regular(directory / INDEX, shown):
        return _from_index(directory, shown)
    if _regular(directory / SINGLE, shown):
        return {SINGLE: []}  # every key of the one file
    held = sorted(p.name for p in directory.iterdir())[:8]
    pickled = (
        " (a pytorch_model.bin is a pickle, which Nitro never loads)"
        if any(n.endswith(".bin") for n in held)
        else ""
    )
    raise CheckpointNotFound(
        f"Source {shown!r} holds no weights: {str(directory)!r} has neither {SINGLE} nor "
        f"{INDEX} (it holds {held or 'nothing'}){pickled}. Write hf: and a directory that "
        "save_pretrained(dir, safe_serialization=True) or export_hf() wrote."
    )


def _regular(path: Path, shown: str) -> bool:
    """Whether ``path`` is a regular file (False when missing), never following a link: a
    file an ``hf:`` directory names that is a link is refused, since it could lead outside
    the root the directory was checked against (DESIGN section 16)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return False
    if stat.S_ISLNK(mode):
        raise UnsafePath(
            f"Source {shown!r}: {str(path)!r} is a symbolic link, and Nitro never follows a "
            "link for a file of an hf: directory (it could lead outside the server's root). "
            "Copy the real file into the directory in its place (cp --remove-destination "
            "--dereference), or export the model there again."
        )
    return stat.S_ISREG(mode)


def _read_json(path: Path, what: str) -> Any:
    """A JSON file of an ``hf:`` directory, opened without following a link and refused
    when over its size limit (:data:`safeio.READ_LIMITS`) before a byte is read."""
    with os.fdopen(safeio.open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        return json.loads(safeio.read_capped(f, what, str(path)))


def _from_index(directory: Path, shown: str) -> dict[str, list[str]]:
    where = str(directory / INDEX)
    try:
        index = _read_json(directory / INDEX, "safetensors index")
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise TypeError("weight_map is not an object of key -> file name")
    except RecursionError:
        raise RecordError(
            f"Source {shown!r}: {where!r} is not a safetensors index (its JSON nests deeper "
            "than Python parses); it must hold "
            '{"metadata": {...}, "weight_map": {"<key>": "<shard file>"}}. Write it again with '
            "save_pretrained() or export_hf()."
        ) from None
    except RecordError:
        raise  # over its size limit
    except (ValueError, KeyError, TypeError) as exc:
        raise RecordError(
            f"Source {shown!r}: {where!r} is not a safetensors index ({_clip(exc)}); it must hold "
            '{"metadata": {...}, "weight_map": {"<key>": "<shard file>"}}. Write it again with '
            "save_pretrained() or export_hf()."
        ) from None
    files: dict[str, list[str]] = {}
    for key, name in weight_map.items():
        if Path(name).name != name or not name.endswith(".safetensors"):
            raise RecordError(
                f"Source {shown!r}: {where!r} maps {key!r} to {name!r}, not a .safetensors file "
                "in that directory. Write the index again with save_pretrained() or export_hf()."
            )
        files.setdefault(name, []).append(key)
    for name in files:
        if not _regular(directory / name, shown):
            raise CheckpointMissing(
                f"Source {shown!r}: {where!r} names the shard {name!r}, which is missing from "
                f"{str(directory)!r}. Copy the whole directory, or export it again."
            )
    return files


def leaf_shapes(directory: Path, shown: str) -> dict[str, list[int]]:
    """Each tensor of a Hugging Face directory by its key, and its shape, from its shards'
    safetensors headers alone (no tensor is read; a header longer than a record's may be,
    or one that does not fit its file, is refused)."""
    shapes: dict[str, list[int]] = {}
    for name in weight_files(directory, shown):
        path = directory / name
        with os.fdopen(safeio.open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 0 or n > MAX_HEADER or 8 + n > size:
                raise unreadable(path, "its header length does not fit the file")
            try:
                header = json.loads(f.read(n))
                shapes.update(
                    {
                        k: [int(d) for d in v["shape"]]
                        for k, v in header.items()
                        if k != "__metadata__"
                    }
                )
            except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
                raise unreadable(path, exc) from None
    return shapes


def read_dir(directory: Path, shown: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Every tensor of a Hugging Face directory by its key, and the provenance Nitro wrote
    there (empty for a directory transformers wrote). A shard Nitro wrote is read through the
    record reader, which checks its digests."""
    tensors: dict[str, torch.Tensor] = {}
    for name, keys in weight_files(directory, shown).items():
        path = directory / name
        with safe_open(str(path), framework="pt") as f:
            ours = META_KEY in (f.metadata() or {})
            found = list(f.keys())
            if not ours:
                tensors.update({k: f.get_tensor(k) for k in found})
        if ours:
            read, _ = read_record(path)
            tensors.update(read)
        missing = [k for k in keys if k not in found]
        if missing:
            raise CheckpointMissing(
                f"Source {shown!r}: the index names {missing[:4]} in {name!r}, which does not "
                "hold them. Export the directory again."
            )
    provenance: dict[str, Any] = {}
    if _regular(directory / PROVENANCE, shown):
        try:
            loaded = _read_json(directory / PROVENANCE, "provenance file")
            provenance = loaded if isinstance(loaded, dict) else {}
        except (ValueError, RecursionError):  # RecordError (over its limit) among them
            provenance = {}
    return tensors, provenance


def _clip(value: object) -> str:
    """An exception's text about a file's contents, cut to 200 characters."""
    text = str(value)
    return text if len(text) <= 200 else text[:200] + "…"
