"""Reading a record's header without its tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nitro_core.store.place import place


def checkpoint_info(path: str | Path) -> dict[str, Any]:
    """The JSON header of a record (step, epoch, seed, run, config, metrics, layout, ...),
    read from the header bytes alone; no tensor is loaded. ``path`` may be a record on object
    storage (``s3://bucket/prefix/run/<record>``) that its run directory's manifest lists:
    ranged reads of its header, checked against the manifest's digest."""
    return place(path).header()
