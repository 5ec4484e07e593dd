"""Resolving a parsed source to record files, from the manifest alone.

``latest`` is the run that wrote the last entry; ``all`` is allowed only as ``all => best``;
``best`` ranks only entries scored under one (metric, mode) pair and warns when the pool
mixes pairs. Nothing asked for is ever replaced by fresh weights: a miss raises, naming the
directory and the runs it holds.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from nitro_core.errors import (
    CheckpointerFix,
    CheckpointNotFound,
    ConfigError,
    Lister,
    NitroWarning,
    Part,
)
from nitro_core.policy import retention
from nitro_core.policy.ranked import ranked
from nitro_core.policy.retention import Pair as ScorePair
from nitro_core.sources import selection
from nitro_core.sources.grammar import Average, HFDirectory, Pair, PathSource, Source
from nitro_core.store import manifest
from nitro_core.store.atomic import TMP_SUFFIX
from nitro_core.store.manifest import ManifestEntry, Point
from nitro_core.store.place import on_disk

_PARTIAL = re.compile(r"\.tmp$|\.stale\d*$")  # what an interrupted write leaves behind


@dataclass(frozen=True)
class Resolved:
    """What a source names: one file (``entry`` when the manifest lists it), or for an
    ``Average`` the picked entries and the one that supplies layer state."""

    source: Source
    path: Path
    entry: ManifestEntry | None
    picked: tuple[ManifestEntry, ...] = ()


def resolve(
    source: Source,
    run_dir: Path,
    entries: list[ManifestEntry],
    pair: ScorePair | None = None,
    points: dict[str, list[Point]] | None = None,
    shown: str | None = None,
) -> Resolved:
    """The file ``source`` names in ``run_dir``; ``pair`` is the (metric, mode) that ranks
    ``best`` (default: the pair of the pool's latest scored entry); ``points`` are the runs'
    histories an ``Average`` names points of (read from ``run_dir``'s manifest when None);
    ``shown``: the run directory as a refusal names it (on object storage its URL, where
    ``run_dir`` is its staging directory)."""
    where = shown or str(run_dir)
    if isinstance(source, HFDirectory):
        return resolve_hf(source, run_dir)
    if isinstance(source, PathSource):
        return _resolve_path(source, run_dir, entries, where)
    if source.run.kind == "all":
        if source.pick == "latest":
            raise ConfigError(
                "'all => latest' names no single checkpoint: every run has its own latest. Write "
                "'latest => latest' (the run that wrote last) or '<run id> => latest'."
            )
        if isinstance(source.pick, Average):
            raise ConfigError(
                f"{str(source)!r}: averaging across runs is planned, not yet supported. Average "
                f"within one run: 'latest => {source.pick}' or '<run id> => {source.pick}'."
            )
    if not entries:
        raise CheckpointNotFound(
            f"No checkpoint matches {str(source)!r} in {where!r}: it holds no checkpoints "
            "(no manifest entries). Train a run there first, or name a record file by its path."
        )
    if source.run.kind == "all":
        pool = entries
    else:
        run = manifest.latest_run(entries) if source.run.kind == "latest" else source.run.id
        assert run is not None  # entries is not empty, and a run id names its run
        pool = manifest.run_entries(entries, run)
        if not pool:
            raise CheckpointNotFound(
                f"No run {run!r} in {where!r}; it holds {manifest.describe_runs(entries)}. "
                f"Write one of those run ids, or 'latest => {source.pick}'."
            )
    if source.pick == "latest":
        return Resolved(source, run_dir / pool[-1].file, pool[-1])
    if source.pick == "best":
        best = pick_best(source, pool, pair, where)
        return Resolved(source, run_dir / best.file, best)
    if points is None:
        points = manifest.read_points(run_dir)
    return resolve_average(source, run_dir, pool, points.get(pool[0].run, []), pair, where)


def resolve_average(
    source: Pair,
    run_dir: Path,
    pool: list[ManifestEntry],
    points: list[Point],
    pair: ScorePair | None,
    shown: str | None = None,
) -> Resolved:
    """The entries ``source``'s Average names in one run (``pool``: its entries, ``points``:
    its history), and its state record. Refuses, listing what the run kept and the keep
    that would have held them, when the run no longer holds every point named."""
    avg = source.pick
    assert isinstance(avg, Average)
    pair = ranking_pair(pool, pair)
    chosen = selection.select(avg.selector, selection.history(points, pool), pool, pair)
    if chosen.shortfall or chosen.gone or not chosen.picked:
        raise CheckpointNotFound(*_refusal(source, shown or str(run_dir), pool, chosen))
    picked = list(chosen.picked)
    if avg.state == "best" or (avg.state is None and avg.selector.ranks):
        best = ranked([e for e in picked if e.pair == pair], pair[1])
        state = best[0] if best else picked[-1]
    else:
        state = picked[-1]
    return Resolved(source, run_dir / state.file, state, picked=tuple(picked))


def _refusal(
    source: Pair, where: str, pool: list[ManifestEntry], chosen: selection.Selection
) -> tuple[Part, ...]:
    avg = source.pick
    assert isinstance(avg, Average)
    head = f"Cannot average {str(source)!r} in {where!r}: "
    kept = " ".join(selection.describe_points(pool))  # 'epochs 2, 4' or 'points epoch 3 ...'
    if chosen.shortfall:
        return (
            f"{head}{chosen.shortfall} (run {pool[0].run} holds {kept}). Average fewer points, "
            "or train the run further.",
        )
    recorded = pool[-1].keep  # the run's own keep, as its latest entry recorded it
    under = f" under keep={recorded}" if recorded else ""
    base = recorded[1:-1] if recorded else "Best(3), Last(1)"  # '(Best(3), Last(1))' -> selectors
    named = " ".join(selection.describe_points(chosen.named))
    # where the message names mid-epoch points, the gone ones by their place too ('epoch 2
    # end (step 12)', not a bare '2' that reads as a count)
    by_place = any(e.batch is not None for e in pool) or any(
        p.batch is not None for p in chosen.named
    )
    gone = selection.describe_points(chosen.gone, by_place)[1]
    return (
        f"{head}{avg.selector} names {named} of run {pool[0].run}, which kept {kept}"
        f"{under}; it no longer holds {gone}. Keep them while training: ",
        CheckpointerFix(f"keep=({base}, {avg.selector.keep_for()})"),
        ".",
    )


def pick_best(
    source: Pair, pool: list[ManifestEntry], pair: ScorePair | None, where: str
) -> ManifestEntry:
    """The best entry of ``pool`` under ``pair``, warning when other pairs are mixed in."""
    scored = [e for e in pool if e.score is not None]
    pair = ranking_pair(pool, pair)
    mine = [e for e in scored if e.pair == pair]
    runs = ", ".join(dict.fromkeys(e.run for e in pool))
    if not mine:
        have = Counter(e.pair for e in scored)
        has = retention.describe_pairs(have) if have else f"only unscored entries x{len(pool)}"
        metric, mode = pair
        (rank_metric, rank_mode), _ = have.most_common(1)[0] if have else ((None, None), 0)
        hint: tuple[Part, ...] = (
            ("Write ", CheckpointerFix(f"metric={rank_metric!r}, mode={rank_mode!r}"),
             f" or rank by {metric} in a new run.")
            if have
            else (f"Write '{source.run} => latest', or keep a 'val' split so epochs are scored.",)
        )  # fmt: skip
        raise CheckpointNotFound(
            f"No checkpoint matches {str(source)!r} in {where!r}: run {runs} has no entry scored "
            f"by {metric} ({mode}); it has {has}. ",
            *hint,
        )
    others = Counter(e.pair for e in scored if e.pair != pair)
    if others:
        warnings.warn(
            f"{str(source)!r} ranks only entries scored by {pair[0]} ({pair[1]}); {where!r} also "
            f"holds {retention.describe_pairs(others)}, which are not compared with them.",
            NitroWarning,
            stacklevel=4,
        )
    return ranked(mine, pair[1], 1)[0]


def ranking_pair(pool: list[ManifestEntry], pair: ScorePair | None) -> ScorePair:
    """``pair`` when it names a metric, else the pair of the pool's latest scored entry (what
    a caller without an experiment, like ``average_checkpoints``, ranks by)."""
    if pair is not None and pair[0] is not None:
        return pair
    scored = [e for e in pool if e.score is not None]
    return scored[-1].pair if scored else (None, None)


def _resolve_path(
    source: PathSource, run_dir: Path, entries: list[ManifestEntry], where: str
) -> Resolved:
    """A record file (``.safetensors``) or a record directory (a ``/`` at the end, or a path
    word that names one here), relative to ``run_dir`` or absolute; refused naming what was
    looked at when nothing is there (``where``: ``run_dir`` as a refusal names it)."""
    given = Path(source.path)
    candidates = [given] if given.is_absolute() else [given, run_dir / given]
    looked = " and ".join(repr(str(p)) for p in candidates)
    if _PARTIAL.search(given.name):
        raise ConfigError(
            f"{source.path!r} is a partial file left by an interrupted write, never a checkpoint. "
            "Name a committed record instead (",
            Lister(where),
            " lists them), e.g. 'latest => latest'.",
        )
    from nitro_core.store import shards  # lazy: a sharded record's reader imports torch

    directory = next((p for p in candidates if shards.is_sharded(p)), None)
    if directory is not None:  # a record directory (several processes wrote it)
        home = directory.resolve().parent
        listing = entries if home == run_dir.resolve() else manifest.read_manifest(home)
        entry = next((e for e in listing if e.file == directory.name), None)
        if entry is None and not (directory / shards.HEADER_NAME).is_file():
            raise CheckpointNotFound(_not_a_record(source, directory))
        return Resolved(source, directory, entry)
    if source.path.endswith("/"):
        raise CheckpointNotFound(
            f"Record directory {source.path!r} not found (looked at {looked}; a sharded record "
            f"is a directory holding header.json); {where!r} holds "
            f"{manifest.describe_runs(entries)}. Write an existing record, or a pair such as "
            "'latest => best'."
        )
    if not given.name.endswith(".safetensors"):  # a path word that names no record
        raise CheckpointNotFound(
            f"Source {source.path!r} names no checkpoint: it is not a pair (a pair holds '=>', "
            f"e.g. 'latest => best'), and no record is there (looked at {looked}: a record file "
            f"ends in .safetensors, a record directory holds header.json); {where!r} "
            f"holds {manifest.describe_runs(entries)}. Write a pair such as 'latest => best', or "
            "the path of an existing record file or record directory."
        )
    for path in candidates:
        if path.is_file():
            break
    else:
        raise CheckpointNotFound(
            f"Checkpoint file {source.path!r} not found (looked at {looked}); {where!r} "
            f"holds {manifest.describe_runs(entries)}. Write an existing path, or a pair such as "
            "'latest => best'."
        )
    if path.is_symlink():  # a link the caller names is theirs to follow (reads never follow)
        path = path.resolve()
    home = path.resolve().parent
    listing = entries if home == run_dir.resolve() else manifest.read_manifest(home)
    entry = next((e for e in listing if e.file == path.name), None)
    return Resolved(source, path, entry)


def resolve_hf(source: HFDirectory, run_dir: Path) -> Resolved:
    """``hf:<dir>``: the directory as given (absolute, or relative to the working directory),
    else relative to ``run_dir``; refused when it holds no safetensors weights."""
    from nitro_core.store import hf  # lazy: it imports torch

    given = on_disk(
        source.path,
        f"{str(source)!r}: hf: takes a local Hugging Face model directory, not a URL. Copy "
        "it down first (e.g. aws s3 cp --recursive), then write hf:<that directory>.",
    )
    candidates = [given] if given.is_absolute() else [given, run_dir / given]
    directory = next((p for p in candidates if p.is_dir()), candidates[0])
    hf.weight_files(directory, str(source))  # refuses a directory without weights
    return Resolved(source, directory, None)


def _not_a_record(source: PathSource, directory: Path) -> str:
    """A directory that is no record: none of its manifest's entries, and no header.json."""
    head = (
        f"Source {source.path!r} is the directory {str(directory)!r}, not a record: it holds no "
        "header.json (a record directory several processes wrote holds header.json and its "
        "shards) and no manifest lists it."
    )
    if (directory / "manifest.json").is_file():
        return head + (
            f" It is a run directory: name one of its checkpoints, e.g. 'latest => best' with "
            f"run_dir={str(directory)!r}."
        )
    return head + (
        " Write the path of a record file or record directory, or a pair such as 'latest => best'."
    )


def partial_files(run_dir: Path) -> list[Path]:
    """``.tmp`` files in ``run_dir`` (left by a killed write, or in flight right now)."""
    return sorted(run_dir.glob(f"*{TMP_SUFFIX}")) if run_dir.is_dir() else []
