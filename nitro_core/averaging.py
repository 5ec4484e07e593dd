"""Averaging checkpoints of one run: the streaming float64 mean over resolved entries, its
provenance, and the averaged record written outside any manifest. (What an ``Average``
names is decided in ``sources``; loading an average into a handle is ``training.restore``.)

Records are read one at a time into a float64 accumulator, so memory holds one tensor of
one record and the sum, never all records. The mean is cast back to each tensor's own
dtype. Integer and boolean tensors are never averaged, and layer state (buffers) is not
averaged either: both come from the record that supplies the state (the best picked when
the selector ranks, else the latest, or as ``state=`` says). Tied parameters are averaged
once. Uniform weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nitro_core.errors import CheckpointCorrupt, ConfigError
from nitro_core.sources.grammar import Average, Pair, to_source
from nitro_core.sources.resolve import Resolved, resolve
from nitro_core.state.records import (
    FORMAT_VERSION,
    framework_version,
    state_dict_from,
    weights_tensors,
)
from nitro_core.store import manifest
from nitro_core.store import recordio as store
from nitro_core.store.claims import refuse_existing


# -- the streaming mean -----------------------------------------------------------------------------
@dataclass
class Averaged:
    """An averaged state: parameters averaged, layer state from ``state_file``."""

    state: dict[str, torch.Tensor]  # model state-dict keys (aliases included)
    ema: dict[str, torch.Tensor] | None  # the EMAs' average, when every picked record has one
    meta: dict[str, Any]  # the state record's header
    averaged_from: dict[str, Any]


def average(resolved: Resolved, run_dir: Path, load_ema: bool = False) -> Averaged:
    """Average the picked records' parameters (and their EMAs when all have one)."""
    picked = resolved.picked
    state_meta = store.read_header(resolved.path)
    layout = state_meta["layout"]
    params = [k for k, _, _ in layout["params"]]
    has_ema = all(_has_ema(run_dir / e.file) for e in picked)
    if load_ema and not has_ema:
        lacking = next(e for e in picked if not _has_ema(run_dir / e.file))
        raise ConfigError(
            f"load_ema=True, but {lacking.file!r} (epoch {lacking.epoch}) keeps no EMA; every "
            "picked record must. Drop load_ema to average their parameters."
        )
    targets = {f"params/{k}" for k in params} | ({f"ema/{k}" for k in params} if has_ema else set())
    sums: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    kept: dict[str, torch.Tensor] = {}  # what the state record supplies as it is
    scratch: dict[torch.dtype, torch.Tensor] = {}
    for i, e in enumerate(picked):
        if i + 1 < len(picked):
            store.prefetch(run_dir / picked[i + 1].file)  # its disk time overlaps this one's work
        is_state = e.file == resolved.path.name
        seen: set[str] = set()

        def want(name: str, is_state: bool = is_state) -> bool:
            return name in targets or (
                is_state and name.startswith(("params/", "buffers/", "ema/"))
            )

        for name, shape, first, piece in store.stream_chunks(run_dir / e.file, e.sha256, want):
            seen.add(name)
            if name in targets and piece.is_floating_point():
                _accumulate(sums, dtypes, scratch, name, shape, first, piece)
            elif is_state:  # counters and layer state, never averaged
                whole = kept.setdefault(name, torch.empty(shape, dtype=piece.dtype))
                whole.view(-1)[first : first + piece.numel()] = piece
        if missing := targets - seen:
            raise CheckpointCorrupt(
                f"Checkpoint {str(run_dir / e.file)!r} lacks {sorted(missing)[0]!r}; the records "
                f"picked for {resolved.source} do not share one layout."
            )
    count = len(picked)
    for name in list(sums):  # cast back one tensor at a time, freeing its sum
        kept[name] = sums.pop(name).div_(count).to(dtypes[name])
    state = state_dict_from(kept, layout)
    ema = state_dict_from(kept, layout, prefix="ema/") if has_ema else None
    averaged_from = {
        "spec": str(resolved.source),
        "run": picked[0].run,
        "directory": str(run_dir),
        "files": [e.file for e in picked],
        "epochs": [e.epoch for e in picked],
        "weights": [1.0 / count] * count,
        "state_from": resolved.path.name,
        "ema": has_ema,
    }
    return Averaged(state=state, ema=ema, meta=state_meta, averaged_from=averaged_from)


def _accumulate(
    sums: dict[str, torch.Tensor],
    dtypes: dict[str, torch.dtype],
    scratch: dict[torch.dtype, torch.Tensor],
    name: str,
    shape: list[int],
    first: int,
    piece: torch.Tensor,
) -> None:
    """``sums[name][first:first+len(piece)] += piece`` in float64, converting through one
    reused scratch buffer so that no temporary is allocated per piece."""
    wide = torch.float64
    if name not in sums:
        sums[name] = torch.zeros(shape, dtype=wide)
        dtypes[name] = piece.dtype
    if wide not in scratch or scratch[wide].numel() < piece.numel():
        scratch[wide] = torch.empty(piece.numel(), dtype=wide)
    converted = scratch[wide][: piece.numel()]
    converted.copy_(piece)
    sums[name].view(-1)[first : first + piece.numel()].add_(converted)


def _has_ema(path: Path) -> bool:
    return store.read_header(path).get("ema_meta") is not None


# -- the public entry points ----------------------------------------------------------------------
def average_checkpoints(
    run_dir: str | Path, source: Any, save: str | Path | None = None
) -> Averaged:
    """Average the checkpoints ``source`` picks in ``run_dir`` (e.g. ``"latest =>
    Average(Last(10))"``); with ``save``, also write the result as an ordinary record outside
    the manifest (retention never deletes it), refusing to overwrite an existing file."""
    run_dir = Path(run_dir)
    src = to_source(source, "source")
    if not (isinstance(src, Pair) and isinstance(src.pick, Average)):
        raise ConfigError(
            f"average_checkpoints needs an Average, got {str(src)!r}; write e.g. "
            "'latest => Average(Last(10))'."
        )
    if save is not None:
        refuse_existing(Path(save), "save=")
    result = average(resolve(src, run_dir, manifest.read_manifest(run_dir)), run_dir)
    if save is not None:
        write_averaged(result, Path(save))
    return result


def write_averaged(result: Averaged, path: Path) -> None:
    """An ordinary record (params/, buffers/, ema/) holding an average, outside any manifest.
    It carries no optimizer state, so it loads with ``weights=`` and refuses ``resume=``."""
    refuse_existing(path, "save=")
    tensors = weights_tensors(result.state, result.ema, result.meta["layout"])
    meta = dict(result.meta)
    meta.update(  # weights only: no optimizer, schedule, RNG or history to resume from
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
