"""A run directory's manifest wherever it lives: on a disk (:mod:`~nitro_core.store.manifest`)
or on object storage (:mod:`~nitro_core.store.object_run`, ``s3://bucket/prefix/run``).
The public ``read_manifest``, ``runs`` and ``read_points`` are these."""

from __future__ import annotations

from pathlib import Path

from nitro_core.store import manifest, object_run, objects
from nitro_core.store.manifest import ManifestEntry, Point
from nitro_core.store.objects import ObjectUrl


def read_manifest(run_dir: str | Path) -> list[ManifestEntry]:
    """The entries of ``run_dir``'s manifest in commit order (empty when there is none);
    ``run_dir`` may be ``s3://bucket/prefix/run``."""
    if objects.is_url(run_dir):
        return object_run.read_manifest(objects.parse(str(run_dir)))
    return manifest.read_manifest(run_dir)


def read_points(run_dir: str | Path) -> dict[str, list[Point]]:
    """Run id -> the points each run passed (empty for runs written before points were kept)."""
    if objects.is_url(run_dir):
        return object_run.load(objects.parse(str(run_dir))).manifest.points
    return manifest.read_points(run_dir)


def runs(run_dir: str | Path) -> list[str]:
    """Ids of the runs with entries in ``run_dir``, in order of their first entry."""
    return list(dict.fromkeys(e.run for e in read_manifest(run_dir)))


def entries_of(run_dir: Path, storage: ObjectUrl | None) -> list[ManifestEntry]:
    """The entries of a handle's run directory: on object storage when ``storage`` names it
    (``run_dir`` is then its staging directory), else on disk."""
    if storage is not None:
        return object_run.read_manifest(storage)
    return manifest.read_manifest(run_dir)
