"""The refusals ``train()`` makes before it trains: another process holds the run, the run
moved on since the handle was built, or its step budget is spent. Each takes plain values
and raises :class:`~nitro_core.errors.TrainingRefused` with the call to write instead."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

from nitro_core.errors import TrainingRefused
from nitro_core.store.manifest import ManifestEntry
from nitro_core.training.budget import Budget


def refuse_held(run_dir: Path, run_id: str) -> NoReturn:
    """Refuse to train a run another process trains now (it holds the run's lock)."""
    raise TrainingRefused(
        f"Run {run_id} in {str(run_dir)!r} is being trained by another process "
        "right now; two processes continuing one run would overwrite each other's "
        "records. Wait for it to end, or start a separate run (resume='false', or "
        "another run_dir)."
    )


def refuse_stale_point(
    entries: list[ManifestEntry], run_dir: Path, run_id: str, step: int, epoch: int
) -> None:
    """Refuse to train when the run moved on since the handle was built (another handle
    or process trained it further; ``entries``: the manifest now): its epochs would be
    written twice under one id."""
    ahead = [e for e in entries if e.run == run_id and e.step > step]
    if ahead:
        e = ahead[-1]
        raise TrainingRefused(
            f"Run {run_id} in {str(run_dir)!r} has moved on since this handle was "
            f"built: the handle is at epoch {epoch} (step {step}), and the manifest "
            f"now lists epoch {e.epoch} (step {e.step}, {e.file!r}) written by another handle. "
            "Training from here would write those epochs twice under one run id. Build a new "
            f"handle that continues from there: Nitro(..., run_dir={str(run_dir)!r}, "
            f"resume='{run_id} => latest')."
        )


def refuse_spent_budget(
    budget: Budget, run_dir: Path, run_id: str, step: int, next_step: int | None = None
) -> None:
    """Refuse to train a run whose ``max_steps`` it has reached already, or whose next
    checkpoint point (at ``next_step``, when known) lies past it: ``max_steps`` is the run's
    total, so a resume with the same budget trains nothing past it."""
    if not budget.left(step):
        raise TrainingRefused(
            f"Run {run_id} in {str(run_dir)!r} is at step {step}, and "
            f"max_steps={budget.max_steps} leaves no step to train. Raise max_steps "
            f"above {step} (it counts the run's steps from its start), or leave it out."
        )
    if budget.max_steps is not None and next_step is not None and next_step > budget.max_steps:
        raise TrainingRefused(
            f"Run {run_id} in {str(run_dir)!r} is at step {step}, its last checkpoint point "
            f"within max_steps={budget.max_steps}: the next point is at step {next_step}. "
            f"Raise max_steps to {next_step} or more (it counts the run's steps from its "
            "start), or leave it out."
        )
