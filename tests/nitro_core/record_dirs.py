"""A record file of a trained run rewritten as a record directory (what an FSDP run writes),
in one process and without torchrun, through the same DCP storage layer as
``test_shards.make``: the same tensors and header, the manifest entry pointing at it."""

from __future__ import annotations

import warnings
from pathlib import Path

from nitro_core.store import manifest, shards
from nitro_core.store import recordio as store


def to_record_directory(run_dir: Path, index: int = -1) -> Path:
    """Rewrite the manifest's entry ``index`` as a record directory; returns its path."""
    run_dir = Path(run_dir)
    with store.manifest_lock(run_dir):
        listing = manifest.load(run_dir)
        entry = listing.entries[index]
        tensors, meta = store.read_record(run_dir / entry.file, entry.expected)
        final = run_dir / entry.file.removesuffix(".safetensors")
        tmp = store.tmp_path(final)
        with warnings.catch_warnings():  # DCP: "assuming the intent is to save in one process"
            warnings.simplefilter("ignore", UserWarning)
            digests = shards.write(tmp, tensors, main=True)
        size, tree = shards.publish(tmp, final, meta, digests)
        listing.entries[index] = entry.model_copy(
            update={"file": final.name, "bytes": size, "digest": tree}
        )
        manifest.save(run_dir, listing)
        (run_dir / entry.file).unlink()
    return final
