"""Checking whole records: ``nitro verify PATH|DIR`` and the ``nitro_verify`` tool.

A reader verifies the sections it reads (averaging never reads the optimizer state); this
reads every byte of every record it is given, so a corruption in a section no reader has
touched yet is found too (:mod:`nitro_core.store.verify` says what is checked, on a disk and
on object storage).
"""

from __future__ import annotations

from pathlib import Path

from nitro_core.store.place import place
from nitro_core.store.verify import Checked


def verify(path: str | Path) -> list[Checked]:
    """Check every byte of the record ``path`` (a file or a record directory), or of every
    record in the run directory ``path`` (listed ones against the manifest too), or of every
    record in and below the directory ``path``; one :class:`Checked` per record, in manifest
    order, unlisted ones after. Raises :class:`CheckpointMissing` when ``path`` holds no
    record at all. ``path`` may be an object-store URL (``s3://bucket/prefix/run``, or a
    record in it): every record its manifest lists, each copied down to a temporary
    directory one at a time and checked there."""
    return place(path).verify()


__all__ = ["Checked", "verify"]
