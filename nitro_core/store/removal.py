"""Carrying a deletion out: the manifest rewritten without the entries and points that go,
then their files unlinked, all under the manifest lock.

The caller's ``decide`` (:func:`nitro_core.policy.deletion_plan.plan_deletion`) makes the
decision from the manifest as read under the lock, so an entry committed between a plan and
its execution is never deleted unseen. The order is retention's: the manifest first (a
record counts only while it is listed), then the files, then a directory fsync; a crash
between the two leaves unlisted files, which count for nothing.

Every name goes through the one deleter (:mod:`nitro_core.store.deleter`, which retention
uses too): a record file, or a record directory with every file in it (its bytes are its
files' sizes summed). Nothing is followed through a link: a listed name that is a link is
unlinked as a link (its target, wherever it leads, is untouched, and 0 bytes are freed), a
link inside a record directory likewise; a name that holds anything else (a FIFO) is left in
place and reported as skipped; a run's log goes only when ``logs/`` is a real directory of
the run directory. A run some process is training
right now (its run lock held) is refused: its trainer would write on after the deletion. A
dry run reads only: it takes no lock and creates no file.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from nitro_core.errors import TrainingRefused
from nitro_core.store import deleter, manifest
from nitro_core.store.claims import manifest_lock, run_lock, run_lock_path
from nitro_core.store.manifest import Manifest, ManifestEntry
from nitro_core.store.safeio import fsync_dir, lock_held

LOGS = "logs"


class Doomed(Protocol):
    """What a plan names: the entries that go, and the runs that go whole."""

    @property
    def entries(self) -> tuple[ManifestEntry, ...]: ...

    @property
    def runs(self) -> tuple[str, ...]: ...


P = TypeVar("P", bound=Doomed)


@dataclass(frozen=True)
class RemovedFile:
    """One file a deletion removes: a record, or a log of a run that goes whole."""

    path: str  # relative to the run directory
    bytes: int  # its size on disk (a record directory's files summed; a link: 0)
    run: str  # the run it belongs to


@dataclass(frozen=True)
class Removed:
    """The files a deletion removed (a dry run: would remove)."""

    files: tuple[RemovedFile, ...]
    missing: tuple[str, ...]  # listed records already gone from disk (their entries go)
    skipped: tuple[str, ...]  # names holding neither a file, a directory nor a link: left
    dry_run: bool


def run_logs(run_dir: Path, run: str) -> list[str]:
    """A run's log files, relative to ``run_dir``: ``logs/<run>.jsonl`` and the TensorBoard
    event files in ``logs/tb/<run>/`` (where :mod:`nitro_core.training.loggers` writes them);
    none found through a link."""
    logs = run_dir / LOGS
    if not _real_dir(logs):
        return []
    names = [f"{LOGS}/{run}.jsonl"]
    events = logs / "tb" / run
    if _real_dir(logs / "tb") and _real_dir(events):
        with os.scandir(events) as it:
            names += sorted(f"{LOGS}/tb/{run}/{e.name}" for e in it)
    return names


def remove(
    run_dir: str | Path, decide: Callable[[Manifest], P], dry_run: bool = True
) -> tuple[P, Removed]:
    """Decide from ``run_dir``'s manifest, then (unless ``dry_run``) rewrite it without the
    plan's entries and the points of its whole runs and unlink their files and logs."""
    run_dir = Path(run_dir)
    if dry_run:
        plan = decide(manifest.load(run_dir))
        for run in _touched(plan):
            if _held(run_dir, run):
                raise _busy(run_dir, run)
        return plan, _survey(run_dir, plan, dry_run=True)
    with manifest_lock(run_dir), ExitStack() as held:
        current = manifest.load(run_dir)
        plan = decide(current)
        for run in _touched(plan):
            held.enter_context(_holding(run_dir, run))
        found = _survey(run_dir, plan, dry_run=False)
        going = {e.file for e in plan.entries}
        current.entries = [e for e in current.entries if e.file not in going]
        for run in plan.runs:
            current.points.pop(run, None)
        manifest.save(run_dir, current)
        for gone in found.files:  # unlisted now; removed under the lock, as retention does
            deleter.remove(run_dir / gone.path)
        for directory in sorted({(run_dir / f.path).parent for f in found.files}, reverse=True):
            fsync_dir(directory)
        for run in plan.runs:  # an emptied directory of event files goes too
            try:
                os.rmdir(run_dir / LOGS / "tb" / run)
            except OSError:  # missing, not empty, or a link: left as it is
                pass
    return plan, found


def _touched(plan: Doomed) -> list[str]:
    return list(dict.fromkeys([*(e.run for e in plan.entries), *plan.runs]))


def _survey(run_dir: Path, plan: Doomed, dry_run: bool) -> Removed:
    files: list[RemovedFile] = []
    missing: list[str] = []
    skipped: list[str] = []
    named = [(e.file, e.run, True) for e in plan.entries]
    named += [(name, run, False) for run in plan.runs for name in run_logs(run_dir, run)]
    for name, run, listed in named:
        found = deleter.survey(run_dir / name)
        if found.kind == "missing":
            if listed:
                missing.append(name)
        elif found.kind == "other" or (found.kind == "directory" and not listed):
            skipped.append(name)
        else:
            files.append(RemovedFile(name, found.bytes, run))
    return Removed(tuple(files), tuple(missing), tuple(skipped), dry_run)


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)  # a link to a directory is not one
    except FileNotFoundError:
        return False


def _held(run_dir: Path, run: str) -> bool:
    """Whether another open file holds ``run``'s training lock, probed without creating the
    lock file."""
    return lock_held(run_lock_path(run_dir, run))


@contextmanager
def _holding(run_dir: Path, run: str) -> Iterator[None]:
    with run_lock(run_dir, run) as mine:
        if not mine:
            raise _busy(run_dir, run)
        yield


def _busy(run_dir: Path, run: str) -> TrainingRefused:
    return TrainingRefused(
        f"Cannot delete from run {run} in {str(run_dir)!r}: a process is training it right now, "
        "and it would write on after the deletion. Stop that training first (or wait for it "
        "to end), then delete again; nothing was deleted."
    )
