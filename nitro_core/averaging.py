"""Averaging checkpoints of one run: the streaming float64 mean over resolved entries, its
provenance, and the averaged record written outside any manifest. (What an ``Average``
names is decided in ``sources``; loading an average into a handle is ``training.restore``.)

Records are read side by side (up to 16 at once), 1 MiB of each at a time into two reused
buffers per record (:meth:`~nitro_core.store.reader.RecordFile.stream`), and folded into
float64 sums while in the cache, once per record. With one group of records (16 or fewer)
each slice of the sum is whole after one step and goes straight to the mean in a reused
scratch buffer: memory holds the means (one record's parameters), a few MiB of buffers, and
what the record that supplies the layer state supplies; never a whole record, nor a
tensor-sized float64 sum. More records keep each tensor's float64 sum across the groups and
divide it at the end. Only the parameter (and EMA) sections of each record are read and
verified, never its optimizer state. Where torch's thread budget has a core to spare, one
thread reads and hashes each record's next piece while the calling thread sums this one;
otherwise the calling thread does both. The mean is cast back to each tensor's own
dtype. Integer and boolean tensors are never averaged, and layer state (buffers) is not
averaged either: both come from the record that supplies the state (the best picked when
the selector ranks, else the latest, or as ``state=`` says). Tied parameters are averaged
once. Uniform weights.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nitro_core.errors import CheckpointCorrupt, ConfigError, arg
from nitro_core.sources.grammar import to_source
from nitro_core.sources.lookup import resolve_at, weights_copies
from nitro_core.sources.resolve import Resolved
from nitro_core.state.loading import WEIGHTS
from nitro_core.state.records import (
    FORMAT_VERSION,
    framework_version,
    keeps_ema,
    state_dict_from,
    weights_tensors,
)
from nitro_core.store import recordio as store
from nitro_core.store.claims import refuse_existing
from nitro_core.store.manifest import ManifestEntry
from nitro_core.store.place import place
from nitro_core.store.reader import RecordFile
from nitro_core.store.record_header import Tensor
from nitro_core.store.run import open_run


# -- the streaming mean -----------------------------------------------------------------------------
@dataclass
class Averaged:
    """An averaged state: parameters averaged, layer state from ``state_file``."""

    state: dict[str, torch.Tensor]  # model state-dict keys (aliases included)
    ema: dict[str, torch.Tensor] | None  # the EMAs' average, when every picked record has one
    meta: dict[str, Any]  # the state record's header
    averaged_from: dict[str, Any]

    def __repr__(self) -> str:
        """What it is, not its tensors: ``Averaged(4 tensors, 1,153 parameters, float32;
        epochs [2, 3] of run 1a2b3c4d in 'runs/r'; ema: no)``."""
        count = sum(t.numel() for t in self.state.values())
        dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in self.state.values()})
        src = self.averaged_from
        return (
            f"Averaged({len(self.state)} tensors, {count:,} parameters, {'/'.join(dtypes)}; "
            f"epochs {src.get('epochs')} of run {src.get('run')} in {src.get('directory')!r}; "
            f"ema: {'yes' if self.ema is not None else 'no'})"
        )


def average(
    resolved: Resolved, run_dir: Path, load_ema: bool = False, shown: str | None = None
) -> Averaged:
    """Average the picked records' parameters (and their EMAs when all have one), read in
    ``run_dir`` (``shown``: the run directory as provenance names it, when that is not
    ``run_dir``: an object-store run directory, whose records were copied down there)."""
    picked = resolved.picked
    state_meta = store.read_header(resolved.path, _expected(resolved.entry))
    layout = state_meta["layout"]
    params = [k for k, _, _ in layout["params"]]
    has_ema = all(_has_ema(run_dir / e.file, e.expected) for e in picked)
    if load_ema and not has_ema:
        lacking = next(e for e in picked if not _has_ema(run_dir / e.file, e.expected))
        raise ConfigError(
            arg("load_ema", True),
            f", but {lacking.file!r} (epoch {lacking.epoch}) keeps no EMA; every picked record "
            "must. Drop load_ema to average their parameters.",
        )
    targets = {f"params/{k}" for k in params} | ({f"ema/{k}" for k in params} if has_ema else set())
    averaged = {"params", "ema"} if has_ema else {"params"}  # the sections read of every record
    count = len(picked)
    groups = _groups(picked)
    sums = _Sums(count, one_pass=len(groups) == 1)
    kept: dict[str, torch.Tensor] = {}  # what the state record supplies as it is
    hasher = _hasher()
    try:
        for g, group in enumerate(groups):
            _fold_group(run_dir, group, g == 0, sums, kept, averaged, targets, resolved, hasher)
    finally:
        if hasher is not None:
            hasher.shutdown()
    kept.update(sums.means())
    state = state_dict_from(kept, layout)
    ema = state_dict_from(kept, layout, prefix="ema/") if has_ema else None
    averaged_from = {
        "spec": str(resolved.source),
        "run": picked[0].run,
        "directory": shown or str(run_dir),
        "files": [e.file for e in picked],
        "epochs": [e.epoch for e in picked],
        "weights": [1.0 / count] * count,
        "state_from": resolved.path.name,
        "ema": has_ema,
    }
    return Averaged(state=state, ema=ema, meta=state_meta, averaged_from=averaged_from)


_GROUP = 16  # records read side by side (each an open file)
_STEP = 1024 * 1024  # bytes of each record per step (measured best of 256 KiB to 4 MiB, cold)


def _fold_group(
    run_dir: Path,
    group: list[ManifestEntry],
    fresh: bool,
    sums: _Sums,
    kept: dict[str, torch.Tensor],
    averaged: set[str],
    targets: set[str],
    resolved: Resolved,
    hasher: ThreadPoolExecutor | None,
) -> None:
    """Add one group of records, read side by side, into ``sums`` (set from the first record
    when ``fresh``); the state record's counters and layer state go to ``kept``."""
    records = _open(run_dir, group)
    try:
        _check_layouts(records, averaged, targets, resolved)
        states = [e.file == resolved.path.name for e in group]
        for step in _lockstep(_streams(records, averaged, hasher)):
            t = step[0][0]
            if t.name in targets and step[0][2].is_floating_point():
                pieces = [p for _, _, p in step]
                sums.add(t.name, t.shape, step[0][1], pieces, fresh)
            elif any(states):  # counters: the state record's, never averaged
                _, first, piece = step[states.index(True)]
                whole = kept.setdefault(t.name, torch.empty(t.shape, dtype=piece.dtype))
                whole.view(-1)[first : first + piece.numel()] = piece
        if any(states):  # layer state, never averaged
            kept.update(records[states.index(True)].read({"buffers"}))
    finally:
        for r in records:
            r.close()


def _streams(
    records: list[Any], sections: set[str], hasher: ThreadPoolExecutor | None
) -> list[Iterator[tuple[Tensor, int, torch.Tensor]]]:
    """Each record's stream of ``sections``, all in one order: a record file yields its
    tensors in file order, a record directory in any order asked, so directories picked
    beside files (a run that changed strategy) follow the files' order."""
    files = [r for r in records if isinstance(r, RecordFile)]
    order = [t.name for t in files[0].tensors if t.section in sections] if files else None
    return [
        r.stream(sections, _STEP, hasher)
        if isinstance(r, RecordFile)
        else r.stream(sections, _STEP, hasher, order=order)
        for r in records
    ]


def _hasher() -> ThreadPoolExecutor | None:
    """A thread that reads and hashes the records' next pieces while this one sums them,
    where torch's thread budget allows a second thread (the sum runs on this thread alone);
    None: this thread reads and hashes too."""
    if torch.get_num_threads() < 2:
        return None
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="nitro-hash")


def _groups(picked: Sequence[ManifestEntry]) -> list[list[ManifestEntry]]:
    return [list(picked[i : i + _GROUP]) for i in range(0, len(picked), _GROUP)]


def _open(run_dir: Path, group: list[ManifestEntry]) -> list[store.RecordFile]:
    """The group's records opened, each header parsed once and checked against the
    manifest."""
    records: list[store.RecordFile] = []
    try:
        for e in group:
            records.append(store.open_record_file(run_dir / e.file, e.expected))
    except BaseException:
        for r in records:
            r.close()
        raise
    return records


def _check_layouts(
    records: list[store.RecordFile], sections: set[str], targets: set[str], resolved: Resolved
) -> None:
    """Refuse records that lack a tensor to average, or whose averaged sections differ (a
    tensor another shape or dtype, or one the others lack), naming the first such record."""
    first: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None
    for record in records:
        mine = {t.name: (t.shape, t.dtype) for t in record.tensors if t.section in sections}
        if missing := targets - mine.keys():
            raise CheckpointCorrupt(
                f"Checkpoint {str(record.path)!r} lacks {sorted(missing)[0]!r}; the records "
                f"picked for {resolved.source} do not share one layout."
            )
        first = mine if first is None else first
        if mine != first:
            name = sorted(n for n in mine.keys() | first.keys() if mine.get(n) != first.get(n))[0]
            raise CheckpointCorrupt(
                f"Checkpoint {str(record.path)!r} holds {name!r} as {_form(mine.get(name))}, the "
                f"first record picked for {resolved.source} as {_form(first.get(name))}; they "
                "do not share one layout."
            )


def _form(form: tuple[tuple[int, ...], torch.dtype] | None) -> str:
    return "nothing" if form is None else f"{list(form[0])} {form[1]}"


def _lockstep(
    streams: list[Iterator[tuple[Tensor, int, torch.Tensor]]],
) -> Iterator[list[tuple[Tensor, int, torch.Tensor]]]:
    """The records' pieces side by side (the same tensor, the same elements), each stream run
    to its end so every record's sections are verified."""
    for step in zip(*streams, strict=True):
        if any(t.name != step[0][0].name or first != step[0][1] for t, first, _ in step):
            raise CheckpointCorrupt(
                f"The records picked yield {step[0][0].name!r} beside "
                f"{sorted({t.name for t, _, _ in step} - {step[0][0].name})}: they do not "
                "share one layout. Average records of one run and one kind."
            )
        yield list(step)


class _Sums:
    """The records' float64 sums, folded piece by piece, and their means.

    With every record read in one group (at most ``_GROUP``), a slice of the sum is whole
    after one step, so it lives in a small scratch buffer the steps reuse and goes straight
    to the mean, in the tensor's own dtype: no tensor-sized float64 sum is made, and no
    second pass divides it. With several groups, each tensor's sum is kept whole across
    them and divided at the end. Either way each element is the same float64 sum, in the
    same order, divided by the count and cast once."""

    def __init__(self, count: int, one_pass: bool) -> None:
        self.count = count
        self.one_pass = one_pass
        self.scratch = torch.empty(0, dtype=torch.float64)
        self.totals: dict[str, torch.Tensor] = {}  # several groups: whole float64 sums
        self.dtypes: dict[str, torch.dtype] = {}
        self.done: dict[str, torch.Tensor] = {}  # means, in each tensor's dtype

    def add(
        self, name: str, shape: tuple[int, ...], first: int, pieces: list[torch.Tensor], fresh: bool
    ) -> None:
        """Fold each record's piece of elements ``first...`` of ``name`` into its sum (set
        from the first piece when ``fresh``: the first group)."""
        n = pieces[0].numel()
        if self.one_pass:
            if self.scratch.numel() < n:
                self.scratch = torch.empty(n, dtype=torch.float64)
            target = self.scratch[:n]
        else:
            if name not in self.totals:
                self.totals[name] = torch.empty(shape, dtype=torch.float64)
                self.dtypes[name] = pieces[0].dtype
            target = self.totals[name].view(-1)[first : first + n]
        _fold(target, pieces, fresh)
        if self.one_pass:
            if name not in self.done:
                self.done[name] = torch.empty(shape, dtype=pieces[0].dtype)
            _divide(target, self.count, self.done[name].view(-1)[first : first + n])

    def means(self) -> dict[str, torch.Tensor]:
        """Every tensor's mean (the whole sums divided one tensor at a time, each freed)."""
        for name in list(self.totals):
            total = self.totals.pop(name)
            self.done[name] = torch.empty(total.shape, dtype=self.dtypes[name])
            _divide(total.view(-1), self.count, self.done[name].view(-1))
        return self.done


_NUMPY = (torch.float16, torch.float32, torch.float64)  # numpy adds these without a temporary
_INLINE = 32768  # elements: under torch's grain size, an op runs on the calling thread alone


def _fold(target: torch.Tensor, pieces: list[torch.Tensor], fresh: bool) -> None:
    """``target += piece`` in float64 for each record's piece of the same elements, on the
    calling thread: the slice stays in the cache while every record is added into it (a
    memory-bound add gains little from more threads, and a parallel region per piece would
    wait on any thread the machine's other work has descheduled; the caller's torch threads
    are left to the caller). With ``fresh`` the slice is set from the first piece rather
    than zeroed first."""
    rest = pieces[1:] if fresh else pieces
    if pieces[0].dtype in _NUMPY:  # numpy converts in small buffers as it adds
        out = target.numpy()
        if fresh:
            np.copyto(out, pieces[0].numpy())
        for piece in rest:
            np.add(out, piece.numpy(), out=out)
        return
    for i in range(0, target.numel(), _INLINE):  # bfloat16, float8: torch, inline
        if fresh:
            target[i : i + _INLINE].copy_(pieces[0][i : i + _INLINE])
        for piece in rest:
            target[i : i + _INLINE].add_(piece[i : i + _INLINE])


def _divide(total: torch.Tensor, count: int, out: torch.Tensor) -> None:
    """``out = (total / count).to(out.dtype)`` (flat tensors), in one pass where numpy has
    the dtype; ``total`` may be overwritten."""
    if out.dtype in _NUMPY:
        np.divide(total.numpy(), count, out=out.numpy(), casting="unsafe")
    else:
        out.copy_(total.div_(count))


def _has_ema(path: Path, expected: str) -> bool:
    return keeps_ema(store.read_header(path, expected))


def _expected(entry: ManifestEntry | None) -> str | None:
    return None if entry is None else entry.expected


# -- the public entry points ----------------------------------------------------------------------
def average_checkpoints(
    run_dir: str | Path, source: Any, save: str | Path | None = None
) -> Averaged:
    """Average the checkpoints ``source`` picks in ``run_dir`` (e.g. ``"latest =>
    Average(Last(10))"``; ``run_dir`` may be ``s3://bucket/prefix/run``); with ``save`` (a
    path, or an ``s3://`` object), also write the result as an ordinary record outside the
    manifest (retention never deletes it), refusing to overwrite an existing file."""
    src = to_source(source, "source")
    if src.averaged() is None:
        raise ConfigError(
            f"average_checkpoints needs an Average, got {str(src)!r}; write e.g. "
            "'latest => Average(Last(10))'."
        )
    if save is not None:
        refuse_new(save)
    run = open_run(run_dir)  # on object storage: the picks' weights ranges, copied down
    with weights_copies(run, resolve_at(src, run, copy=False), WEIGHTS) as (here, private):
        result = average(here, private, shown=str(run))
    if save is not None:
        place(save, "save").write_new("save=", lambda path: write_averaged(result, path))
    return result


def refuse_new(save: str | Path) -> None:
    """Refuse ``save=`` (a path or an ``s3://`` object) before any record is read, when it
    exists or names no ``.safetensors`` file."""
    place(save, "save").refuse_taken("save=")


def write_averaged(result: Averaged, path: Path, metrics: dict[str, float] | None = None) -> None:
    """An ordinary record (params/, buffers/, ema/) holding an average, outside any manifest.
    It carries no optimizer state, so it loads with ``weights=`` and refuses ``resume=``.
    Its ``metrics`` are the average's own (``metrics``: its validation), else none: never
    those of the record that supplied its layer state."""
    refuse_existing(path, "save=")
    tensors = weights_tensors(result.state, result.ema, result.meta["layout"])
    meta = dict(result.meta)
    meta.update(  # weights only: no optimizer, schedule, RNG or history to resume from
        metrics=dict(metrics or {}),
        optimizer=None,
        scheduler=None,
        plateau=None,
        rng=None,
        early_stopping=None,
        history=None,
        format_version=FORMAT_VERSION,
        framework_version=framework_version(),
        averaged_from=result.averaged_from,
        stop_reason=None,
    )
    if result.ema is None:
        meta["ema_meta"] = None
    path.parent.mkdir(parents=True, exist_ok=True)
    store.write_record(path, tensors, meta)
