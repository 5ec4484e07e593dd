"""A run directory's manifest wherever it lives (:func:`~nitro_core.store.run.open_run`: a
disk, or ``s3://bucket/prefix/run``). The public ``read_manifest``, ``runs`` and
``read_points`` are these."""

from __future__ import annotations

from pathlib import Path

from nitro_core.store.manifest import ManifestEntry, Point
from nitro_core.store.run import RunStore, open_run


def read_manifest(run_dir: str | Path | RunStore) -> list[ManifestEntry]:
    """The entries of ``run_dir``'s manifest in commit order (empty when there is none);
    ``run_dir`` may be ``s3://bucket/prefix/run``."""
    return open_run(run_dir).entries()


def read_points(run_dir: str | Path | RunStore) -> dict[str, list[Point]]:
    """Run id -> the points each run passed (empty for runs written before points were kept)."""
    return open_run(run_dir).points()


def runs(run_dir: str | Path | RunStore) -> list[str]:
    """Ids of the runs with entries in ``run_dir``, in order of their first entry."""
    return list(dict.fromkeys(e.run for e in read_manifest(run_dir)))
