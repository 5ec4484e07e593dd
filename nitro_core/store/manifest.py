"""The manifest: which records a directory holds, and the lookups that read it alone.

``manifest.json`` lists one :class:`ManifestEntry` per kept record, in commit order. A
record counts only once the manifest lists it; lookups, selection, resume and retention
read these entries and never open a record.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from nitro_core.errors import CheckpointCorrupt
from nitro_core.store import recordio as store

FORMAT: Final = "nitro-manifest/1"

Mode = Literal["min", "max"]
StopReason = Literal["completed", "early_stop", "requested"]


def _finite(v: float | None) -> float | None:
    if v is not None and not math.isfinite(v):
        raise ValueError(f"score {v!r} is not finite; a NaN or infinite score cannot be ranked")
    return v


Score = Annotated[float | None, AfterValidator(_finite)]  # refused when read, as the spec says


class ManifestEntry(BaseModel):
    """One kept record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str = Field(description="Record file name, relative to the run directory.")
    epoch: int = Field(ge=0, description="The epoch the record ends, or is in (mid-epoch).")
    batch: int | None = Field(
        default=None,
        ge=1,
        description="Batches of the epoch consumed at a mid-epoch record "
        "(Checkpointer(every_steps=N)); null at an epoch end.",
    )
    step: int = Field(ge=0)
    score: Score = Field(description="The monitored metric at this epoch, if validated.")
    metric: str | None = Field(description="Name of the ranked metric, e.g. 'loss' or 'acc'.")
    mode: Mode | None
    stop_reason: StopReason | None = Field(description="Set on the record a run ended with.")
    run: str = Field(description="Id of the run that wrote the record.")
    parent: str | None = Field(
        default=None, description="'<run>/<file>' of the record this run branched from."
    )
    written: str = Field(description="UTC time the record was committed (ISO 8601).")
    keep: str | None = Field(
        default=None,
        description="The keep selectors of the run that wrote it, e.g. '(Best(3), Last(1))'.",
    )
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("file")
    @classmethod
    def _bare_name(cls, v: str) -> str:
        if "/" in v or "\\" in v or v.startswith(".") or not v.endswith(".safetensors"):
            raise ValueError(f"file {v!r} is not a bare record name in the run directory")
        return v

    @property
    def pair(self) -> tuple[str | None, Mode | None]:
        return (self.metric, self.mode)


class Point(BaseModel):
    """One checkpoint point a run passed (an epoch end, or with ``every_steps`` a step inside
    an epoch: ``batch`` set), written or not: what ``Last(k)`` and ``Best(k)`` mean when a run
    is averaged ("the last k points", "the best k ever scored")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epoch: int = Field(ge=0)
    batch: int | None = Field(default=None, ge=1)
    step: int = Field(ge=0)
    score: Score = None
    metric: str | None = None
    mode: Mode | None = None

    @property
    def pair(self) -> tuple[str | None, Mode | None]:
        return (self.metric, self.mode)


class Manifest(BaseModel):
    """The whole manifest file: the kept entries, and every run's points."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["nitro-manifest/1"] = FORMAT
    entries: list[ManifestEntry] = Field(default_factory=list)
    points: dict[str, list[Point]] = Field(
        default_factory=dict,
        description="Run id -> every point the run passed, oldest first (written or not).",
    )

    def add_point(self, run: str, point: Point) -> None:
        """Record ``point``; points of ``run`` at or past its step belong to a timeline a
        resume replaced, and are dropped."""
        mine = [p for p in self.points.get(run, []) if p.step < point.step]
        self.points[run] = [*mine, point]


_MANIFEST = TypeAdapter(Manifest)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def read_manifest(run_dir: str | Path) -> list[ManifestEntry]:
    """The entries of ``run_dir``'s manifest in commit order (empty when there is none)."""
    return load(Path(run_dir)).entries


def load(run_dir: Path) -> Manifest:
    data = store.load_manifest_bytes(Path(run_dir))
    if data is None:
        return Manifest()
    try:
        with store.paused_gc():
            return _MANIFEST.validate_json(data)
    except ValueError as exc:
        raise CheckpointCorrupt(
            f"Manifest {str(run_dir / store.MANIFEST_NAME)!r} is not valid: {exc}. "
            "Restore it from a backup; the records beside it are intact."
        ) from None


def save(run_dir: Path, manifest: Manifest) -> None:
    """Write the manifest; the caller holds ``store.manifest_lock(run_dir)``."""
    store.save_manifest_json(run_dir, manifest.model_dump(mode="json"))


def read_points(run_dir: str | Path) -> dict[str, list[Point]]:
    """Run id -> the points each run passed (empty for runs written before points were kept)."""
    return load(Path(run_dir)).points


def runs(run_dir: str | Path) -> list[str]:
    """Ids of the runs with entries in ``run_dir``, in order of their first entry."""
    return list(dict.fromkeys(e.run for e in read_manifest(run_dir)))


def run_entries(entries: list[ManifestEntry], run: str) -> list[ManifestEntry]:
    return [e for e in entries if e.run == run]


def latest_run(entries: list[ManifestEntry]) -> str | None:
    """The run that wrote the last entry."""
    return entries[-1].run if entries else None


def describe_runs(entries: list[ManifestEntry]) -> str:
    """'a1b2c3d4 (4 entries, epochs 1-4), ...' for error messages."""
    if not entries:
        return "no runs"
    parts = []
    for run in dict.fromkeys(e.run for e in entries):
        mine = run_entries(entries, run)
        epochs = sorted(e.epoch for e in mine)
        parts.append(f"{run} ({len(mine)} entries, epochs {', '.join(map(str, epochs))})")
    return "runs " + "; ".join(parts)
