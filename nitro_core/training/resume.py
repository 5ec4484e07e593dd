"""Resume: which record a handle continues, and the checks that make the resume exact.

``resume=False`` starts fresh; ``"auto"`` is ``latest => latest`` except that a directory
with nothing to resume starts fresh with a warning. Resuming a run's latest record
continues that run under its id; any other record branches into a new run whose entries
name it as their ``parent``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nitro_core.errors import (
    WEIGHTS_ONLY,
    CheckpointNotFound,
    ConfigError,
    NitroWarning,
    ResumeRefused,
)
from nitro_core.experiment import Experiment, config_diff
from nitro_core.sources import lookup
from nitro_core.sources.grammar import Source
from nitro_core.sources.resolve import resolve
from nitro_core.state.records import Record
from nitro_core.store import manifest
from nitro_core.store import recordio as store
from nitro_core.store.manifest import ManifestEntry
from nitro_core.store.run import RunStore
from nitro_core.training.step import StepSettings, step_diff


@dataclass
class ResumePoint:
    """A record chosen to resume from, with its header already read."""

    path: Path  # where it is read here (on object storage: its copy in the staging directory)
    entry: ManifestEntry | None  # None: a file the manifest does not list
    meta: dict[str, Any]
    continue_run: str | None  # the run continued under its own id, or None to branch
    shown: str | None = None  # the record as its run directory names it (S3: its URL)

    @property
    def file(self) -> str:
        """The record as messages name it: its URL on object storage, never the copy."""
        return self.shown or str(self.path)

    @property
    def seed(self) -> int:
        return int(self.meta["seed"])

    @property
    def parent(self) -> str | None:
        if self.continue_run is not None:
            return self.entry.parent if self.entry else None
        run = self.meta.get("run", "?")
        return f"{run}/{self.path.name}"

    def check_config(self, exp: Experiment) -> None:
        """Refuse a changed plain field, with the diff."""
        diff = config_diff(self.meta["config"], exp)
        if diff:
            name = type(exp).__name__
            recorded = ", ".join(f"{k}={v!r}" for k, v in self.meta["config"].items())
            raise ResumeRefused(
                f"Cannot resume {self.file!r}: the config changed since it was recorded:\n"
                + "\n".join(diff)
                + f"\nPlain fields must match for an exact resume (Host fields may change). "
                f"Resume with {name}({recorded}), or start a new run that takes only the "
                "weights: ",
                WEIGHTS_ONLY,
                ".",
            )

    def check_step(self, exp: Experiment, settings: StepSettings) -> None:
        """Refuse a changed precision or accumulation (the trajectory would change), with the diff."""
        recorded = self.meta.get("training_step") or {}
        diff = step_diff(recorded, settings)
        if diff:
            name = type(exp).__name__
            default = StepSettings()  # a record from before these hooks: their defaults
            precision = recorded.get("precision", default.precision)
            k = recorded.get("accumulate_grad_batches", default.accumulate_grad_batches)
            raise ResumeRefused(
                f"Cannot resume {self.file!r}: the training step changed since it was recorded:\n"
                + "\n".join(diff)
                + f"\nAn exact resume takes the step the record was trained with: return "
                f"{precision!r} from {name}.precision() and {k} from "
                f"{name}.accumulate_grad_batches(), or start a new run that takes only the "
                "weights: ",
                WEIGHTS_ONLY,
                ".",
            )

    def check_resumable(self) -> None:
        """Refuse a record that holds weights only (an average or an export)."""
        if self.meta.get("optimizer") is None:
            origin = (
                " (an average of " + ", ".join(self.meta["averaged_from"]["files"]) + ")"
                if self.meta.get("averaged_from")
                else ""
            )
            raise ResumeRefused(
                f"Cannot resume {self.file!r}{origin}: it holds weights only, no optimizer "
                f"state, step or RNG. Start a new run from it with weights={self.file!r}."
            )

    def check_environment(self, num_threads: int, device: Any) -> None:
        """Warn when the process differs from the recording one in ways that change the bits."""
        env = self.meta.get("environment") or {}
        recorded = env.get("num_threads")
        if recorded is not None and recorded != num_threads and str(device) == "cpu":
            warnings.warn(
                f"{self.file!r} was written with torch.get_num_threads()={recorded}, this process "
                f"has {num_threads}: CPU kernels may reduce in another order, so the resume may "
                f"not continue bit for bit. Call torch.set_num_threads({recorded}) before Nitro(...).",
                NitroWarning,
                stacklevel=4,
            )

    def check_layout(self, layout: dict[str, Any]) -> None:
        """Refuse a moved parameter layout, with the diff."""
        recorded = self.meta["layout"]
        lines = _layout_diff(recorded, layout)
        if lines:
            raise ResumeRefused(
                f"Cannot resume {self.file!r}: the parameter layout moved since it was recorded, "
                "which would scramble the optimizer state against the parameters:\n"
                + "\n".join(lines)
                + "\nRestore the model and optimizer groups the record was written with, or "
                "start a new run that takes only the weights: ",
                WEIGHTS_ONLY,
                ".",
            )

    def load(self) -> Record:
        tensors, meta = store.read_record(self.path, self.entry.expected if self.entry else None)
        return Record(meta=meta, tensors=tensors)


def resume_from_source(
    source: Source, run: RunStore, entries: list[ManifestEntry], fetch: bool = True
) -> ResumePoint:
    """The resume point a source names: continue its run when it is the run's latest
    listed record in ``run``, else branch (``fetch``: see :func:`point_for`)."""
    if source.averaged() is not None:
        raise ConfigError(
            f"resume={str(source)!r}: an average carries no optimizer state to continue. Start "
            f"a new run from it with weights={str(source)!r}, or resume a record: "
            f"resume='{str(source).partition(' => ')[0]} => latest'."
        )
    if source.needs_manifest() and not entries:
        raise CheckpointNotFound(
            f"Nothing to resume in {str(run)!r} for resume={str(source)!r}: it holds no "
            "checkpoints. Use resume='auto' to start fresh when there is nothing to resume."
        )
    home, named = lookup.home_of(source, run)
    if home != run:  # another run directory's record: a branch
        found = lookup.resolve_at(source, run)
    else:
        entry = lookup.named_entry(named, run)  # a record this run directory lists by name
        if entry is not None:
            return point_for(entry, entries, run, fetch)
        found = resolve(source, run.local, entries)
    if found.entry is not None and found.path.parent.resolve() == run.local.resolve():
        return point_for(found.entry, entries, run, fetch)
    return ResumePoint(
        path=found.path,
        entry=found.entry,
        continue_run=None,
        meta=store.read_header(found.path, found.entry.expected if found.entry else None),
        shown=str(lookup.shown_record(home, found.path)),  # where it lies (S3: its URL)
    )


def latest_point(entries: list[ManifestEntry], run: RunStore, fetch: bool = True) -> ResumePoint:
    """``latest => latest``: the last entry of the run that wrote the last entry."""
    if not entries:
        raise CheckpointNotFound(
            f"Nothing to resume in {str(run)!r}: its manifest lists no checkpoints. Train "
            "first, or use resume='auto' to start fresh when there is nothing."
        )
    return point_for(entries[-1], entries, run, fetch)


def point_for(
    entry: ManifestEntry, entries: list[ManifestEntry], run: RunStore, fetch: bool = True
) -> ResumePoint:
    """A resume point at a listed entry: continue its run when it is the run's latest. The
    record is made readable here first (:meth:`RunStore.fetch`: on object storage copied
    down into the staging directory); with ``fetch=False`` only its header is read (a check
    before a job: the point is never loaded)."""
    path = run.fetch(entry) if fetch else run.local / entry.file
    own = manifest.run_entries(entries, entry.run)
    continue_run = entry.run if own and own[-1].file == entry.file else None
    meta = store.read_header(path, entry.expected) if fetch else run.header(entry)
    shown = str(lookup.shown_record(run, path))
    return ResumePoint(path=path, entry=entry, meta=meta, continue_run=continue_run, shown=shown)


def _layout_diff(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    lines = []
    for kind in ("params", "buffers"):
        old = {n: (tuple(s), d) for n, s, d in recorded.get(kind, [])}
        new = {n: (tuple(s), d) for n, s, d in current.get(kind, [])}
        for n in old.keys() - new.keys():
            lines.append(f"  {kind[:-1]} {n}: {_fmt(old[n])} -> (missing)")
        for n in new.keys() - old.keys():
            lines.append(f"  {kind[:-1]} {n}: (not in the record) -> {_fmt(new[n])}")
        for n in old.keys() & new.keys():
            if old[n] != new[n]:
                lines.append(f"  {kind[:-1]} {n}: {_fmt(old[n])} -> {_fmt(new[n])}")
        if not lines and [n for n, *_ in recorded.get(kind, [])] != [
            n for n, *_ in current.get(kind, [])
        ]:
            lines.append(f"  {kind} order changed")
    if recorded.get("groups") != current.get("groups"):
        lines.append(f"  optimizer groups: {recorded.get('groups')} -> {current.get('groups')}")
    return sorted(lines)


def _fmt(shape_dtype: tuple[Any, ...]) -> str:
    shape, dtype = shape_dtype
    return f"{list(shape)} {dtype}"
