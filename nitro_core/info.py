"""Reading a record's header without its tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nitro_core.store.record_header import read_header


def checkpoint_info(path: str | Path) -> dict[str, Any]:
    """The JSON header of a record (step, epoch, seed, run, config, metrics, layout, ...),
    read from the header bytes alone; no tensor is loaded."""
    path = Path(path)
    return read_header(path.resolve() if path.is_symlink() else path)  # named: followed
