"""Reading a record's header without its tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nitro_core.store import object_run, objects
from nitro_core.store.record_header import read_header


def checkpoint_info(path: str | Path) -> dict[str, Any]:
    """The JSON header of a record (step, epoch, seed, run, config, metrics, layout, ...),
    read from the header bytes alone; no tensor is loaded. ``path`` may be a record on object
    storage (``s3://bucket/prefix/run/<record>``) that its run directory's manifest lists:
    ranged reads of its header, checked against the manifest's digest."""
    if objects.is_url(path):
        url = objects.parse(str(path), "path")
        return object_run.read_header(url, object_run.listed(url).expected)
    path = Path(path)
    return read_header(path.resolve() if path.is_symlink() else path)  # named: followed
