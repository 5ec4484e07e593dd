"""Which records, points and logs a deletion removes, decided from the manifest alone.

:func:`plan_deletion` takes a directory's manifest (its entries and every run's points) and
what was asked for, and returns a :class:`DeletionPlan`; it never touches a disk.
:mod:`nitro_core.store.removal` carries a plan out under the manifest lock, and
:func:`nitro_core.deletion.delete_checkpoints` joins the two.

What goes:

- ``run=`` alone: every entry of that run, its points and its log (``logs/<run>.jsonl``).
- ``files=`` (with ``run=``, every file must belong to that run): those entries and their
  files; the runs' points and logs stay, so their histories still say what they passed.
- neither: every run of the directory, as if each were named with ``run=``.

Another run's entries, points and log are never part of a plan: only the entries named (or
the named run's own) are taken, and a file of another run named beside ``run=`` is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nitro_core.errors import CheckpointNotFound, ConfigError
from nitro_core.store.manifest import ManifestEntry, Point

SHOWN = 5  # names quoted in a refusal before "... (N in all)"


@dataclass(frozen=True)
class DeletionPlan:
    """The entries that go (their record files with them), in manifest order, and the runs
    that go whole (their points and log too)."""

    entries: tuple[ManifestEntry, ...]
    runs: tuple[str, ...]
    points: int  # points dropped with the runs that go whole

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(e.file for e in self.entries)

    @property
    def bytes(self) -> int:
        """The bytes the manifest recorded for the entries that go."""
        return sum(e.bytes for e in self.entries)


def plan_deletion(
    entries: Sequence[ManifestEntry],
    points: dict[str, list[Point]],
    run: str | None = None,
    files: Sequence[str] | None = None,
    where: str = "the run directory",
) -> DeletionPlan:
    """What deleting ``run`` and/or ``files`` from a directory holding ``entries`` and
    ``points`` removes; refused (with the names to write instead) when something named is
    not there. ``where`` names the directory in messages."""
    known = list(dict.fromkeys([*(e.run for e in entries), *points]))
    if not known:
        raise CheckpointNotFound(
            f"Nothing to delete in {where!r}: its manifest lists no checkpoints and no runs."
        )
    if run is not None and run not in known:
        raise CheckpointNotFound(
            f"run={_echo(run)} is not a run of {where!r}; it holds {_names('runs', known)}. "
            "Write one of those run ids."
        )
    if files is None:
        whole = (run,) if run is not None else tuple(known)
        return DeletionPlan(
            entries=tuple(e for e in entries if e.run in whole),
            runs=whole,
            points=sum(len(points.get(r, [])) for r in whole),
        )
    return DeletionPlan(entries=_named(entries, files, run, where), runs=(), points=0)


def _named(
    entries: Sequence[ManifestEntry], files: Sequence[str], run: str | None, where: str
) -> tuple[ManifestEntry, ...]:
    if not files:
        raise ConfigError(
            "files=[] names nothing to delete; give record file names as the manifest lists "
            "them, e.g. files=['epoch-0003-step-24-loss=0.5.safetensors'], or leave files out "
            "to delete a whole run (run='<run id>')."
        )
    by_file = {e.file: e for e in entries}
    for name in files:
        entry = by_file.get(name) if isinstance(name, str) else None
        if entry is None:
            listed = [e.file for e in entries]
            raise CheckpointNotFound(
                f"files: {_echo(name)} is not listed in {where!r}'s manifest, and Nitro deletes "
                f"only records a manifest lists; it lists {_names('files', listed)}."
            )
        if run is not None and entry.run != run:
            raise ConfigError(
                f"files: {name!r} belongs to run {entry.run}, not to run={run!r}, and a deletion "
                f"never touches another run's files. Drop it from files, or leave run out."
            )
    wanted = set(files)
    return tuple(e for e in entries if e.file in wanted)


def _names(kind: str, names: Sequence[str]) -> str:
    if not names:
        return f"no {kind}"
    shown = ", ".join(names[:SHOWN])
    return f"{kind} {shown}" + (f", ... ({len(names)} in all)" if len(names) > SHOWN else "")


def _echo(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"
