"""Record directories (what an FSDP run writes) made in one process, without torchrun,
through the same DCP storage layer and commit as the sharded writer: a trained run's listed
records rewritten as directories, one shard per "rank" (the tensors split by section)."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import torch

from nitro_core.store import manifest, shards
from nitro_core.store import recordio as store


def write_directory(final: Path, tensors: dict[str, torch.Tensor], meta: dict, ranks: int = 2):
    """Publish ``tensors`` as the record directory ``final`` with ``ranks`` shard files (rank
    r holds every ``ranks``-th section); returns (bytes, the manifest's digest)."""
    tmp = store.tmp_path(final)
    sections = sorted({name.split("/", 1)[0] for name in tensors})
    digests: dict[str, str] = {}
    for rank in range(ranks):
        part = {k: v for k, v in tensors.items() if k.split("/", 1)[0] in sections[rank::ranks]}
        scratch = final.with_name(f"{final.name}.rank{rank}")
        with warnings.catch_warnings():  # DCP: "assuming the intent is to save in one process"
            warnings.simplefilter("ignore", UserWarning)
            ((name, value),) = shards.write(scratch, part, main=True).items()
        shard = f"shard-{rank + 1:05d}-model-00001-of-00001.safetensors"
        tmp.mkdir(exist_ok=True)
        (scratch / name).rename(tmp / shard)
        shutil.rmtree(scratch)
        digests[shard] = value
    return shards.publish(tmp, final, meta, digests)


def to_record_directories(run_dir: Path, ranks: int = 2) -> list[Path]:
    """Rewrite every record ``run_dir``'s manifest lists as a record directory; returns them."""
    run_dir = Path(run_dir)
    out = []
    with store.manifest_lock(run_dir):
        listing = manifest.load(run_dir)
        for i, entry in enumerate(listing.entries):
            tensors, meta = store.read_record(run_dir / entry.file, entry.expected)
            final = run_dir / entry.file.removesuffix(".safetensors")
            size, tree = write_directory(final, tensors, meta, ranks)
            (run_dir / entry.file).unlink()
            listing.entries[i] = entry.model_copy(
                update={"file": final.name, "bytes": size, "digest": tree}
            )
            out.append(final)
        manifest.save(run_dir, listing)
    return out
