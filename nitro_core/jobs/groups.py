"""Seed groups: one training call run once per seed, followed and compared as one item.

A group is a file ``<root>/.nitro/groups/<group id>.json`` naming its jobs in seed order,
written before the first job is created (the job ids are chosen first), so a group whose
start failed half way still names every job it started; each job's spec names its group
too. Its state is its jobs' states taken together (:func:`group_state`): queued while every
job waits, running while any is live, and once all have ended ``succeeded`` when every one
trained to its end (:func:`finished`: succeeded, or stopped by its budget), else the worst
end: ``failed`` before ``lost`` before ``stopped``. Each seed trains its own run directory,
``<run_dir>/seed-<s>``, so the seeds of a group run side by side within the job limit.
"""

from __future__ import annotations

import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nitro_core.errors import CheckpointNotFound, ConfigError, UnsafePath
from nitro_core.jobs.files import TERMINAL, JobState, JobStatus, read_model, real_dir, write_json
from nitro_core.store.manifest import now_iso

GROUPS = "groups"  # under the job store
PREFIX = "group-"
GROUP_ID = re.compile(r"group-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}")  # matched whole (fullmatch)
JOB_ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{6}")
MAX_SEEDS = 16
SEEDS_EXAMPLE = "e.g. seeds=[0, 1, 2]"
_ENDS: tuple[JobState, ...] = (
    "failed",
    "lost",
    "stopped",
)  # the worst end first: what a group that ended short says


class Group(BaseModel):
    """What a group is: its jobs (in the order of its seeds) and where each trains."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group: str
    experiment: str
    run_dir: str = Field(description="The directory holding each seed's run directory.")
    seeds: list[int]
    jobs: list[str]
    run_dirs: list[str]
    created: str

    @model_validator(mode="after")
    def _whole(self) -> Group:
        """A file that is not a group Nitro wrote is refused, never half read."""
        if not is_group_id(self.group):
            raise ValueError(f"{self.group!r} is not a group id")
        if not 2 <= len(self.seeds) <= MAX_SEEDS or not (
            len(self.seeds) == len(self.jobs) == len(self.run_dirs)
        ):
            raise ValueError("seeds, jobs and run_dirs must be 2 to 16 entries each, alike")
        if not all(JOB_ID.fullmatch(j) for j in self.jobs) or len(set(self.jobs)) != len(self.jobs):
            raise ValueError("jobs must be distinct job ids")
        return self


def is_group_id(text: object) -> bool:
    return isinstance(text, str) and GROUP_ID.fullmatch(text) is not None


def new_group_id() -> str:
    return f"{PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def seed_dir(run_dir: Path, seed: int) -> Path:
    """The run directory of ``seed`` in a group training ``run_dir``."""
    return run_dir / f"seed-{seed}"


def check_seeds(seeds: object) -> list[int]:
    """``seeds`` as a list of 2 to ``MAX_SEEDS`` distinct seeds, or a refusal saying what to
    write (each seed is checked as ``seed=`` is, by the caller)."""
    if not isinstance(seeds, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) for s in seeds
    ):
        raise ConfigError(
            f"seeds={str(seeds)[:80]} is not a list of seeds; write a list of 2 to {MAX_SEEDS} "
            f"distinct integers, {SEEDS_EXAMPLE}."
        )
    if not 2 <= len(seeds) <= MAX_SEEDS:
        raise ConfigError(
            f"seeds names {len(seeds)} seed{'s' * (len(seeds) != 1)}; a group runs 2 to "
            f"{MAX_SEEDS} ({SEEDS_EXAMPLE}). For one run send seed= instead."
        )
    twice = sorted(s for s, n in Counter(seeds).items() if n > 1)
    if twice:
        raise ConfigError(
            f"seeds repeats {', '.join(map(str, twice))}; each seed of a group trains once, so "
            f"send each once, {SEEDS_EXAMPLE}."
        )
    return list(seeds)


def write_group(store_dir: Path, group: Group) -> None:
    directory = store_dir / GROUPS
    if not real_dir(directory):  # a link is refused, never followed
        directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / f"{group.group}.json", group)


def read_group(store_dir: Path, group_id: str, listed: str) -> Group:
    """The group ``group_id``; ``listed``: where its ids are listed, for the refusal."""
    if not is_group_id(group_id):
        raise ConfigError(
            f"{str(group_id)[:80]!r} is not a group id; nitro_train(seeds=[...]) returns one "
            f"(e.g. 'group-20261206-211900-a1b2c3'); {listed}."
        )
    directory = store_dir / GROUPS
    try:
        real_dir(directory)
        group = read_model(directory, f"{group_id}.json", Group)
    except UnsafePath:
        raise
    except (OSError, ValueError) as exc:
        why = "it was never started here, or its file is gone"
        if not isinstance(exc, OSError):
            why = "its file is not a group Nitro wrote"
        raise CheckpointNotFound(
            f"No group {group_id!r} under {str(directory)!r} ({why}); {listed}."
        ) from None
    if group.group != group_id:
        raise CheckpointNotFound(
            f"No group {group_id!r} under {str(directory)!r} (its file names another group, "
            f"{group.group!r}); {listed}."
        )
    return group


def group_state(statuses: Sequence[JobStatus]) -> JobState:
    """The state of a group whose jobs' statuses are ``statuses``."""
    states = [s.state for s in statuses]
    if any(s == "running" for s in states) or (
        any(s == "queued" for s in states) and any(s != "queued" for s in states)
    ):
        return "running"
    if all(s == "queued" for s in states):
        return "queued"
    for end in _ENDS:
        if any(s.state == end and not finished(s) for s in statuses):
            return end
    return "succeeded"


def counts(statuses: Sequence[JobStatus]) -> dict[str, int]:
    """How many of a group's jobs are in each state, the empty ones left out."""
    found = Counter(s.state for s in statuses)
    return {
        state: found[state]
        for state in (*("queued", "running", "succeeded"), *_ENDS)
        if found[state]
    }


def ended(statuses: Sequence[JobStatus]) -> bool:
    return all(s.state in TERMINAL for s in statuses)


def finished(status: JobStatus) -> bool:
    """Whether a seed's job trained to its end: it succeeded, or its run stopped at its
    budget (``max_steps``, ``time_limit``: the job ends ``stopped``, its record written)."""
    if status.state == "succeeded":
        return True
    return status.state == "stopped" and (status.result or {}).get("stop_reason") == "budget"


def member_statuses(group: Group, status: Callable[[str], JobStatus]) -> list[JobStatus]:
    """Each job's status, in seed order: a job that is not there (pruned since, or never
    created when the group's start failed) reads as lost, and so does a job of another
    group (a file naming jobs it did not start)."""
    out = []
    for job_id, run_dir in zip(group.jobs, group.run_dirs, strict=True):
        why = "its job directory is not there (pruned, or the group's start failed before it)"
        try:
            found = status(job_id)
        except CheckpointNotFound:
            found = None
        if found is not None and found.run_dir != run_dir:
            found, why = None, "the job under its id trains another run directory"
        out.append(found if found is not None else JobStatus(
            job_id=job_id, kind="train", state="lost", run_dir=run_dir, created=group.created,
            error=why,
        ))  # fmt: skip
    return out


def new_group(
    group_id: str, experiment: str, run_dir: Path, seeds: list[int], jobs: list[str]
) -> Group:
    """The group of ``seeds`` training under ``run_dir``, its jobs' ids chosen already."""
    return Group(
        group=group_id, experiment=experiment, run_dir=str(run_dir), seeds=seeds, jobs=jobs,
        run_dirs=[str(seed_dir(run_dir, s)) for s in seeds], created=now_iso(),
    )  # fmt: skip


__all__ = [
    "Group",
    "check_seeds",
    "counts",
    "ended",
    "finished",
    "group_state",
    "is_group_id",
    "member_statuses",
    "new_group",
    "new_group_id",
    "read_group",
    "seed_dir",
    "write_group",
]
