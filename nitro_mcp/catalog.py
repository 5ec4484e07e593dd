"""Finding, comparing and exporting runs: what ``nitro_runs`` does without a run directory
(or with one that holds no manifest), ``nitro_compare`` and ``nitro_export``
(:mod:`nitro_mcp.delete_call` deletes).

The walk for run directories never follows a link, skips hidden directories (``.nitro``,
``.git``), virtual environments and package caches, and stops at a depth and a count of
entries scanned. Every reply is bounded: a page of run directories stops before its JSON
passes ``BUDGET`` characters and gives a cursor; lists of files, metrics and config fields
are cut with a count of what was left out.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nitro_core.errors import CheckpointNotFound, ConfigError, NitroError
from nitro_core.sources.grammar import Source, to_source
from nitro_core.store import manifest, metrics_log
from nitro_core.store.manifest import Manifest, ManifestEntry, Point
from nitro_core.store.manifest_file import MANIFEST_NAME
from nitro_core.store.objects import ObjectUrl
from nitro_core.store.place import place
from nitro_core.store.record_header import read_header
from nitro_mcp import models
from nitro_mcp.echo import clip, clip_text
from nitro_mcp.paths import directory_inside_root, file_in_the_way, inside_root, shown
from nitro_mcp.replies import PAGE_BUDGET, REPLY_MAX

if TYPE_CHECKING:
    from nitro_core.experiment import Experiment

MAX_DEPTH = 6  # directories below the one walked
MAX_SCANNED = 20_000  # directory entries looked at in one walk
SKIP = frozenset({"node_modules", "__pycache__", "site-packages", "venv"})
BUDGET = PAGE_BUDGET  # characters of run directories in one page of nitro_runs
NAME_CHARS = 200  # of a path shown in a hint or a comparison
CONFIG_CHARS = 300
SHOWN_METRICS = 8
SHOWN_FIELDS = 20
RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
EXAMPLE_SOURCES = "e.g. sources=['runs/a', 'runs/b:a1b2c3d4']"


# -- nitro_runs: run directories under the root ------------------------------------------------
def holds_manifest(directory: Path) -> bool:
    """Whether ``directory`` holds a ``manifest.json`` that is a file (a link is not one)."""
    try:
        return stat.S_ISREG(os.lstat(directory / MANIFEST_NAME).st_mode)
    except OSError:
        return False


@dataclass(frozen=True)
class Walk:
    found: list[Path]  # directories holding a manifest, sorted by path
    complete: bool  # False: the walk stopped at MAX_SCANNED entries


def find_run_dirs(base: Path) -> Walk:
    """Directories at or below ``base`` that hold a manifest, breadth first and bounded."""
    found: list[Path] = []
    scanned = 0
    queue = deque([(base, 0)])
    while queue:
        directory, depth = queue.popleft()
        subdirs, has_manifest, venv = [], False, False
        try:
            with os.scandir(directory) as it:
                for entry in it:
                    scanned += 1
                    if scanned > MAX_SCANNED:
                        return Walk(sorted(found), complete=False)
                    if entry.name == MANIFEST_NAME:
                        has_manifest = entry.is_file(follow_symlinks=False)
                    elif entry.name == "pyvenv.cfg":
                        venv = True
                    elif _walkable(entry):
                        subdirs.append(Path(entry.path))
        except OSError:  # unreadable, or gone meanwhile: skipped
            continue
        if venv:
            continue
        if has_manifest:
            found.append(directory)
            subdirs = [d for d in subdirs if d.name != "logs"]  # the run's own logs
        if depth < MAX_DEPTH:
            queue.extend((d, depth + 1) for d in sorted(subdirs))
    return Walk(sorted(found), complete=True)


def _walkable(entry: os.DirEntry[str]) -> bool:
    name = entry.name
    return not name.startswith(".") and name not in SKIP and entry.is_dir(follow_symlinks=False)


def run_dirs(root: Path, base: Path | None, limit: int, cursor: str | None) -> models.RunsResult:
    """A page of the run directories at or below ``base`` (the root when None)."""
    start = page_start(cursor, limit, 100)
    walk = find_run_dirs(base or root)
    page: list[models.RunDirSummary] = []
    size = 0
    for directory in walk.found[start : start + limit]:
        item = summarize(root, directory)
        size += len(item.model_dump_json())
        if page and size > BUDGET:
            break
        page.append(item)
    end = start + len(page)
    return models.RunsResult(
        run_dir=None if base is None else shown(root, base), runs=[], run_dirs=page,
        total=len(walk.found), next_cursor=str(end) if end < len(walk.found) else None,
        hint=_listing_hint(root, base, walk),
    )  # fmt: skip


def _listing_hint(root: Path, base: Path | None, walk: Walk) -> str:
    names = [clip_text(shown(root, d), NAME_CHARS) for d in walk.found[:5]]
    more = "" if walk.complete else (
        f" The walk stopped after {MAX_SCANNED} entries; name a directory to look further "
        "below it, e.g. nitro_runs(run_dir='runs')."
    )  # fmt: skip
    if base is None:
        if not names:
            return (
                "No directory under the root holds a manifest.json yet; start a run with "
                "nitro_train (nitro_experiments lists what can be trained)." + more
            )
        also = (
            f"; nitro_compare(sources=[{names[0]!r}, {names[1]!r}]) compares two"
            if len(names) > 1
            else ""
        )
        return f"nitro_runs(run_dir={names[0]!r}) shows one directory's runs{also}." + more
    where = shown(root, base)
    if not names:
        return (
            f"{where}/ holds no manifest, and no directory below it does; nitro_runs() lists "
            "every run directory under the root." + more
        )
    total = len(walk.found)
    listed = ", ".join(names) + (f", ... ({total} in all)" if total > 5 else "")
    return (
        f"{where}/ holds no manifest; run directories below it: {listed}. Call "
        f"nitro_runs(run_dir={names[0]!r})." + more
    )


def summarize(root: Path, directory: Path) -> models.RunDirSummary:
    """One run directory: its runs, experiment and config, best score, last write, bytes."""
    where = shown(root, directory)
    try:
        current = manifest.load(directory)
    except NitroError as exc:  # a manifest that does not parse: listed, with why
        return models.RunDirSummary(
            run_dir=where, error=clip_text(str(exc), 200), bytes=disk_bytes(directory)
        )
    entries = current.entries
    run_ids = list(dict.fromkeys([*(e.run for e in entries), *current.points]))
    best = best_of(entries, current.points)
    meta = latest_header(directory, entries)
    return models.RunDirSummary(
        run_dir=where, runs=run_ids[-10:], run_count=len(run_ids), checkpoints=len(entries),
        experiment=meta.get("experiment"), config=_config_text(meta.get("config")),
        metric=best.metric, mode=best.mode, best_score=best.score, best_run=best.run,
        last_written=max((e.written for e in entries), default=None),
        parent=meta.get("parent"), parent_diff=_lineage(meta), bytes=disk_bytes(directory),
    )  # fmt: skip


def _lineage(meta: dict[str, Any]) -> dict[str, list[Any]] | None:
    """What a run changed from the record it branched from, as its records carry it."""
    diff = meta.get("parent_diff")
    if not isinstance(diff, dict):
        return None
    return {str(k): v for k, v in diff.items() if isinstance(v, list) and len(v) == 2}


def _config_text(config: Any) -> str | None:
    if not isinstance(config, dict):
        return None
    text = ", ".join(f"{k}={json.dumps(v)}" for k, v in config.items())
    return clip_text(text, CONFIG_CHARS)


def latest_header(directory: Path, entries: Sequence[ManifestEntry]) -> dict[str, Any]:
    """The header of the last listed record (empty when none can be read)."""
    if not entries:
        return {}
    try:
        return read_header(directory / entries[-1].file)
    except (NitroError, OSError):
        return {}


def disk_bytes(directory: Path, limit: int = 10_000) -> int:
    """Bytes of the regular files at or below ``directory`` (logs included), no link
    followed, a nested run directory left to its own line, at most ``limit`` entries."""
    total, seen = 0, 0
    stack = [directory]
    while stack and seen < limit:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                for entry in it:
                    seen += 1
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                    elif entry.is_dir(follow_symlinks=False):
                        if not holds_manifest(Path(entry.path)):
                            stack.append(Path(entry.path))
        except OSError:
            continue
    return total


@dataclass(frozen=True)
class Best:
    metric: str | None = None
    mode: str | None = None
    score: float | None = None
    run: str | None = None
    epoch: int | None = None


def best_of(entries: Sequence[ManifestEntry], points: dict[str, list[Point]]) -> Best:
    """The best score under the pair of the latest scored entry, over the entries and every
    point the runs passed (an epoch not written still counts)."""
    scored = [e for e in entries if e.score is not None]
    if scored:
        pair = scored[-1].pair
    else:
        last = [p for pts in points.values() for p in pts if p.score is not None]
        if not last:
            return Best()
        pair = last[-1].pair
    candidates: list[tuple[float, str, int]] = [
        (e.score, e.run, e.epoch) for e in scored if e.pair == pair and e.score is not None
    ]
    for run, pts in points.items():
        candidates += [
            (p.score, run, p.epoch) for p in pts if p.pair == pair and p.score is not None
        ]
    pick = min if pair[1] == "min" else max
    score, run, epoch = pick(candidates, key=lambda c: c[0])
    return Best(pair[0], pair[1], score, run, epoch)


def page_start(cursor: str | None, limit: int, most: int) -> int:
    if not isinstance(limit, int) or not 1 <= limit <= most:
        raise ConfigError(f"limit={clip(limit)} is out of range; give 1 to {most}.")
    if cursor is None:
        return 0
    if not (isinstance(cursor, str) and cursor.isascii() and cursor.isdigit() and len(cursor) <= 9):
        raise ConfigError(
            f"cursor={clip(cursor)} is not a cursor; pass the next_cursor of the previous page."
        )
    return int(cursor)


# -- nitro_compare -------------------------------------------------------------------------------
def compare(root: Path, sources: list[str]) -> models.CompareResult:
    """Two to eight runs side by side: what differs in their plain config, their best and
    final metrics, epochs, wall time and parent."""
    if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
        raise ConfigError(
            f"sources={clip(sources)} must be a list of run directories, {EXAMPLE_SOURCES}."
        )
    if len(sources) > 8:
        raise ConfigError(
            f"sources names {len(sources)} runs; nitro_compare compares 2 to 8 at once, "
            f"{EXAMPLE_SOURCES}."
        )
    manifests: dict[Path, Manifest] = {}
    picked: list[tuple[Path, str]] = []
    for i, text in enumerate(sources):
        directory, runs = run_source(root, text, f"sources[{i}]", manifests)
        picked += [(directory, run) for run in runs]
    if not 2 <= len(picked) <= 8:
        raise ConfigError(
            f"sources={clip(sources)} names {len(picked)} run{'s' * (len(picked) != 1)}; "
            f"nitro_compare compares 2 to 8, {EXAMPLE_SOURCES} (a directory alone is its "
            "latest run; 'runs/a:all' is each of its runs)."
        )
    return side_by_side(root, picked, manifests)


def side_by_side(
    root: Path, picked: Sequence[tuple[Path, str]], manifests: dict[Path, Manifest] | None = None
) -> models.CompareResult:
    """The runs ``picked`` (run directory, run id) side by side, within the reply's size."""
    manifests = {} if manifests is None else manifests
    for directory, _ in picked:
        if directory not in manifests:
            manifests[directory] = manifest.load(directory)
    facts = [_facts(root, d, run, manifests[d]) for d, run in picked]
    diff, omitted = _config_diff([f.config for f in facts], {h for f in facts for h in f.host})
    result = models.CompareResult(
        runs=[f.summary for f in facts], config_diff=diff, config_diff_omitted=omitted,
        next="nitro_history(run_dir=..., run=...) shows a run's curves; nitro_runs() lists "
        "every run directory.",
    )  # fmt: skip
    while len(result.model_dump_json()) > REPLY_MAX - 500 and result.config_diff:
        result.config_diff.pop(next(reversed(result.config_diff)))  # the last fields go first
        result.config_diff_omitted += 1
    return result


def run_source(
    root: Path, text: str, what: str, manifests: dict[Path, Manifest]
) -> tuple[Path, list[str]]:
    """The run directory ``text`` names and its runs: ``'runs/a'`` (its latest run),
    ``'runs/a:<run id>'`` or ``'runs/a:all'``; ``what``: the argument, for a refusal."""
    head, _, tail = text.rpartition(":")
    path_text, run = (head, tail) if head and RUN_ID.match(tail) else (text, "latest")
    directory = directory_inside_root(root, path_text, what)
    where = shown(root, directory)
    if not holds_manifest(directory):
        raise CheckpointNotFound(
            f"{what}={clip(text)}: {where} holds no manifest.json, so it is no run directory; "
            "nitro_runs() lists the run directories under the root."
        )
    if directory not in manifests:
        manifests[directory] = manifest.load(directory)
    current = manifests[directory]
    known = list(dict.fromkeys([*(e.run for e in current.entries), *current.points]))
    if not known:
        raise CheckpointNotFound(
            f"{what}={clip(text)}: {where} holds no runs yet (its manifest is empty)."
        )
    if run == "all":
        return directory, known
    if run == "latest":
        return directory, [manifest.latest_run(current.entries) or known[-1]]
    if run not in known:
        listed = ", ".join(f"'{where}:{r}'" for r in known[-5:])
        raise CheckpointNotFound(
            f"{what}={clip(text)}: {where} has no run {run!r}; write one of {listed}."
        )
    return directory, [run]


@dataclass(frozen=True)
class _Facts:
    summary: models.CompareRun
    config: dict[str, Any]
    host: set[str]


def _facts(root: Path, directory: Path, run: str, current: Manifest) -> _Facts:
    mine = manifest.run_entries(current.entries, run)
    points = current.points.get(run, [])
    meta = latest_header(directory, mine)
    rows, wall_from = _log_rows(directory, run), "log"
    if not rows:
        rows, wall_from = [r for r in meta.get("history") or [] if _epoch_row(r)], "record"
    wall = sum(float(r.get("seconds") or 0) for r in rows) if rows else None
    if wall is None and len(mine) > 1:
        wall, wall_from = _span(mine[0].written, mine[-1].written), "manifest"
    final = dict(rows[-1].get("val") or {}) if rows else dict(meta.get("metrics") or {})
    if rows and rows[-1].get("train_loss") is not None:
        final["train_loss"] = rows[-1]["train_loss"]
    best = best_of(mine, {run: points})
    epochs = [e.epoch for e in mine] + [p.epoch for p in points]
    epochs += [int(rows[-1]["epoch"])] if rows else []
    summary = models.CompareRun(
        source=clip_text(f"{shown(root, directory)}:{run}", NAME_CHARS), experiment=meta.get("experiment"),
        epochs=max(epochs, default=0), step=max([e.step for e in mine] + [p.step for p in points], default=0),
        checkpoints=len(mine), metric=best.metric, mode=best.mode, best_score=best.score,
        best_epoch=best.epoch, final=_bounded_metrics(final, best.metric),
        wall_s=None if wall is None else round(wall, 3), wall_from=None if wall is None else wall_from,
        parent=mine[0].parent if mine else meta.get("parent"), parent_diff=_lineage(meta),
        stop_reason=mine[-1].stop_reason if mine else None,
    )  # fmt: skip
    recorded = meta.get("config")
    config: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    return _Facts(summary, config, set(meta.get("host_fields") or ()))


def _epoch_row(row: Any) -> bool:
    return isinstance(row, dict) and isinstance(row.get("val"), dict) and "epoch" in row


def _log_rows(directory: Path, run: str) -> list[dict[str, Any]]:
    """The epoch rows of ``logs/<run>.jsonl`` (the core's one reader), or none when it is
    missing, a link, or longer than the reader reads: the record's history stands in."""
    try:
        if not stat.S_ISDIR(os.lstat(directory / "logs").st_mode):
            return []
        log = metrics_log.read_log(directory, run)
    except (OSError, NitroError):
        return []
    return [] if log.cut else [row for row in log.rows if _epoch_row(row)]


def _span(first: str, last: str) -> float | None:
    try:
        a, b = (datetime.fromisoformat(t.replace("Z", "+00:00")) for t in (first, last))
    except ValueError:
        return None
    return (b - a).total_seconds()


def _bounded_metrics(final: dict[str, Any], first: str | None) -> dict[str, float | None]:
    names = sorted(final, key=lambda k: (k != first, k != "loss", k))[:SHOWN_METRICS]
    return {k: final[k] if isinstance(final[k], int | float) else None for k in names}


def _config_diff(configs: list[dict[str, Any]], host: set[str]) -> tuple[dict[str, list[Any]], int]:
    """Plain fields whose values differ between the runs: field -> value in each run."""
    names = sorted({k for c in configs for k in c} - host)
    differing = [
        k for k in names if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1
    ]
    shown_ = differing[:SHOWN_FIELDS]
    return {k: [_bounded(c.get(k)) for c in configs] for k in shown_}, len(differing) - len(shown_)


def _bounded(value: Any) -> Any:
    text = json.dumps(value)
    return value if len(text) <= 80 else clip_text(text, 80)


# -- nitro_export ----------------------------------------------------------------------------------
_IN_PYTHON = (
    "export format='weights' (its state dict), or write the directory in Python with "
    "export_hf(source, out_dir, config=...)."
)


def _hf_fix() -> Any:
    from nitro_core.hf_export import ConfigFix  # lazy: it imports torch

    return ConfigFix(
        unregistered="Start the server with --experiment-module naming the module that defines "
        f"it (nitro_experiments lists the registered ones), or {_IN_PYTHON}",
        not_transformers=f"nitro_export takes no config: {_IN_PYTHON}",
    )


@dataclass(frozen=True)
class HFOptions:
    """``nitro_export(..., format="hf")``: a Hugging Face directory's options."""

    dtype: str | None = None
    max_shard_size: str = "5GB"
    experiments: Mapping[str, type[Experiment]] | None = None  # the server's registry


def export(
    root: Path,
    source: str,
    path: str,
    run_dir: str | None,
    hf: HFOptions | None = None,
    url: ObjectUrl | None = None,
) -> models.ExportResult:
    """Write a checkpoint's weights (parameters and layer state) to a new file in the root,
    or with ``hf`` to a new Hugging Face model directory. ``url``: the run directory is on
    object storage (``run_dir`` its URL, confined by the caller)."""
    target = inside_root(root, path, "path")
    example = "e.g. path='exports/model-hf'" if hf else "e.g. path='exports/model.safetensors'"
    if hf is None and target.suffix != ".safetensors":
        raise ConfigError(f"path={clip(path)} must name a .safetensors file, {example}.")
    blocker = file_in_the_way(target.parent)
    if blocker is not None:
        raise ConfigError(
            f"path={clip(path)} lies under the file {clip(shown(root, blocker))}, not a "
            f"directory; give a path in a directory, {example}."
        )
    if os.path.lexists(target):
        raise ConfigError(
            f"path={clip(path)} already exists; Nitro never overwrites it. Choose a new name."
        )
    src = to_source(source, "source")
    where: Path | str
    named = src.record_path() or src.hf_directory()  # a path source's path (None: a pair)
    if url is not None and (
        named is None or place(named, "source").local_path() is None or "/" not in named.rstrip("/")
    ):  # a pair, or a record of the object-store run directory (by its name or its URL)
        where = str(url)
    elif named is not None:
        base = directory_inside_root(root, run_dir, "run_dir") if run_dir and not url else root
        candidates = [inside_root(root, str(b / named), "source") for b in (root, base)]
        found = next((p for p in candidates if p.exists()), candidates[-1])  # file or record dir
        src, where = src.rooted(lambda _: str(found)), found.parent  # hf: stays an hf: source
    else:
        if run_dir is None:
            raise ConfigError(
                f"source={clip(source)} names a checkpoint of a run, so it needs run_dir; write "
                f"nitro_export(source={clip(source)}, path={clip(path)}, run_dir='runs/Classifier')."
            )
        where = directory_inside_root(root, run_dir, "run_dir")
        if not holds_manifest(where):
            raise CheckpointNotFound(
                f"run_dir={clip(run_dir)} holds no manifest.json; nitro_runs(run_dir={clip(run_dir)}) "
                "lists the run directories below it."
            )
    if hf is not None:
        return _export_hf(root, src, target, where, hf)
    from nitro_core.export import export_weights  # lazy: it imports torch

    written = export_weights(src, target, run_dir=where)
    assert isinstance(written, Path)  # the target is a path inside the root
    meta = read_header(written)
    averaged = meta.get("averaged_from") or {}
    return models.ExportResult(
        path=shown(root, written), bytes=written.stat().st_size,
        source_file=shown(root, meta.get("source_file")), run=meta.get("run"),
        epoch=meta.get("epoch"), step=meta.get("step"), experiment=meta.get("experiment"),
        averaged_files=len(averaged.get("files", [])) or None,
        next="model.load_state_dict(safetensors.torch.load_file(path)) restores the weights; "
        f"nitro_checkpoint_info(path={shown(root, written)!r}) shows where they came from.",
    )  # fmt: skip


def _export_hf(
    root: Path, src: Source, target: Path, where: Path | str, options: HFOptions
) -> models.ExportResult:
    from nitro_core.hf_export import export_hf_using  # lazy: it imports torch

    written = export_hf_using(
        options.experiments, src, target, dtype=options.dtype,
        max_shard_size=options.max_shard_size, run_dir=where, fix=_hf_fix(),
    )  # fmt: skip
    meta = json.loads((written / "nitro_provenance.json").read_text())
    averaged = meta.get("averaged_from") or {}
    size = sum(p.stat().st_size for p in written.iterdir())
    return models.ExportResult(
        path=shown(root, written), bytes=size,
        source_file=shown(root, meta.get("source_file")), run=meta.get("run"),
        epoch=meta.get("epoch"), step=meta.get("step"), experiment=meta.get("experiment"),
        averaged_files=len(averaged.get("files", [])) or None,
        next=f"AutoModelForCausalLM.from_pretrained({shown(root, written)!r}) loads it; "
        f"weights='hf:{shown(root, written)}' starts a run from it.",
    )  # fmt: skip


__all__ = [
    "HFOptions",
    "compare",
    "export",
    "find_run_dirs",
    "holds_manifest",
    "run_dirs",
    "run_source",
    "side_by_side",
    "summarize",
]
