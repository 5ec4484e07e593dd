"""Deleting checkpoints and runs: what ``nitro_delete`` does. A dry run unless the call says
``dry_run=false``, and it says exactly what goes (:mod:`nitro_mcp.job_cleanup` removes ended
jobs).

A deletion is refused while a queued or running job of this root uses the run directory (its
run directory, or a path source naming a record file or record directory in it), naming the job and the calls that stop
or follow it; :func:`nitro_core.deletion.delete_checkpoints` does the rest (the manifest lock,
another run's files never touched, a run being trained refused).
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeGuard

from nitro_core.deletion import Deletion, delete_checkpoints
from nitro_core.errors import CheckpointNotFound, ConfigError, NitroError, TrainingRefused
from nitro_core.jobs import JobManager, JobStatus
from nitro_core.store.place import Place, place
from nitro_mcp import models
from nitro_mcp.catalog import RUN_ID, holds_manifest
from nitro_mcp.echo import clip, clip_text
from nitro_mcp.following import follow_call
from nitro_mcp.paths import shown
from nitro_mcp.replies import fit

SHOWN_FILES = 50
FILES_BUDGET = 4_000  # characters of the files listed in one reply


# -- nitro_delete ----------------------------------------------------------------------------------
def delete(
    root: Path,
    jobs: JobManager,
    run_dir: str,
    where: Place,
    run: str | None,
    files: list[str] | None,
    dry_run: bool,
) -> models.DeleteResult:
    """Delete a run or some records of the run directory ``where`` (``run_dir`` as the call
    wrote it, confined by the caller), a dry run by default, refused while a queued or
    running job of this root uses the directory."""
    local = where.local_path()
    if local is not None and not holds_manifest(local):
        raise CheckpointNotFound(
            f"run_dir={clip(run_dir)} holds no manifest.json, so nothing there is Nitro's to "
            f"delete; nitro_runs(run_dir={clip(run_dir)}) lists the run directories below it."
        )
    if run is not None and not (isinstance(run, str) and RUN_ID.match(run)):
        raise ConfigError(
            f"run={clip(run)} is not a run id; nitro_runs(run_dir={clip(run_dir)}) lists them."
        )
    if files is not None and (
        not isinstance(files, list)
        or len(files) > 1000
        or not all(isinstance(f, str) for f in files)
    ):
        raise ConfigError(
            f"files={clip(files)} must be a list of at most 1000 record file names as "
            f"nitro_manifest(run_dir={clip(run_dir)}) lists them."
        )
    blocker = _job_using(root, jobs, where)
    if blocker is not None:
        follow = follow_call(blocker.job_id)
        raise TrainingRefused(
            f"run_dir={clip(run_dir)} is in use by job {blocker.job_id} ({blocker.kind}, "
            f"{blocker.state}), which reads or writes its checkpoints; nothing was deleted. Stop "
            f"it with nitro_stop(job_id='{blocker.job_id}') or wait for its end with {follow}, "
            "then call nitro_delete again."
        )
    done = delete_checkpoints(str(where), run, files, dry_run)
    return _deletion_result(root, done, run_dir, run, files)


def _job_using(root: Path, jobs: JobManager, where: Place) -> JobStatus | None:
    """A queued or running job whose run directory is ``where`` (first), else one whose path
    source names a record inside it (on object storage: by its URL)."""
    live = jobs.live()  # the queued and running jobs, from the index
    for status in live:
        if where.same(place(status.run_dir, "run_dir")):
            return status
    for status in live:
        try:
            spec = jobs.spec(status.job_id)
        except NitroError:
            continue
        for text in (
            getattr(spec.call, k, None) for k in ("weights", "resume", "source", "restore_best")
        ):
            if _names_a_record_in(text, where, root, spec.run_dir):
                return status
    return None


def _names_a_record_in(text: object, where: Place, root: Path, run_dir: str) -> bool:
    """Whether a job's source string names a record inside ``where``: by its URL (object
    storage), or by its path, relative to the root or the job's run directory."""
    if not _is_path(text):  # a pair, a flag, an hf: directory
        return False
    own = place(run_dir, "run_dir").local_path()
    return where.holds(text, (root,) if own is None else (root, own))


def _is_path(text: object) -> TypeGuard[str]:
    """Whether a job's source string names a record by its path (not a pair, a flag or a
    Hugging Face directory)."""
    return (
        isinstance(text, str)
        and "=>" not in text
        and text.strip().lower() not in ("", "auto", "false", "true")
        and not text.startswith("hf:")
    )


def _deletion_result(
    root: Path, done: Deletion, run_dir: str, run: str | None, files: list[str] | None
) -> models.DeleteResult:
    epochs = {e.file: e.epoch for e in done.entries}
    listed = [
        models.DeletedFile(file=f.path, run=f.run, epoch=epochs.get(f.path), bytes=f.bytes)
        for f in done.files[:SHOWN_FILES]
    ]
    listed = listed[: fit(listed, SHOWN_FILES, FILES_BUDGET)]  # long names: fewer of them
    where = shown(root, str(done.run_dir))
    args = f"run_dir={where!r}" + (f", run={run!r}" if run is not None else "")
    if files is not None:
        named = f", files={files!r}"
        args += named if len(named) <= 600 else f", files=[the same {len(files)} names]"
    if done.dry_run:
        nxt = (
            f"Dry run: nothing was deleted. nitro_delete({args}, dry_run=false) deletes these "
            f"{len(done.files)} files ({human_bytes(done.bytes)}) and {len(done.entries)} manifest entries."
        )
    else:
        nxt = (
            f"Deleted {len(done.files)} files ({human_bytes(done.bytes)}) and {len(done.entries)} "
            f"manifest entries. nitro_runs(run_dir={where!r}) shows what remains."
        )
    return models.DeleteResult(
        run_dir=where, dry_run=done.dry_run, files=listed, files_total=len(done.files),
        entries=len(done.entries), runs=list(done.runs)[:50], points=done.points, bytes=done.bytes,
        missing=[clip_text(n, 100) for n in done.missing[:10]],
        skipped=[clip_text(n, 100) for n in done.skipped[:10]], next=nxt,
    )  # fmt: skip


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{int(size)} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} bytes"


__all__ = ["delete", "human_bytes"]
