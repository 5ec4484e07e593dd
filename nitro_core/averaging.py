"""Averaging checkpoints of one run: selection, the streaming float64 mean, and provenance.

Records are read one at a time into a float64 accumulator, so memory holds one tensor of
one record and the sum, never all records. The mean is cast back to each tensor's own
dtype. Integer and boolean tensors are never averaged, and layer state (buffers) is not
averaged either: both come from the record that supplies the state (the best picked when
the selector ranks, else the latest, or as ``state=`` says). Tied parameters are averaged
once. Uniform weights.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nitro_core import manifest, selection, store
from nitro_core.errors import CheckpointCorrupt, CheckpointNotFound, ConfigError, NitroWarning
from nitro_core.manifest import ManifestEntry, Point
from nitro_core.records import state_dict_from
from nitro_core.resolve import Resolved, ranking_pair
from nitro_core.retention import Pair as ScorePair
from nitro_core.selectors import Best, Checkpointer, Selector, ranked
from nitro_core.sources import Average, Pair, RunRef, Source, to_source

if TYPE_CHECKING:
    from nitro_core.handle import Nitro


# -- selection ------------------------------------------------------------------------------------
def resolve_average(
    source: Pair,
    run_dir: Path,
    pool: list[ManifestEntry],
    points: list[Point],
    pair: ScorePair | None,
) -> Resolved:
    """The entries ``source``'s Average names in one run (``pool``: its entries, ``points``:
    its history), and its state record. Refuses, listing what the run kept and the keep
    that would have held them, when the run no longer holds every point named."""
    avg = source.pick
    assert isinstance(avg, Average)
    pair = ranking_pair(pool, pair)
    chosen = selection.select(avg.selector, selection.history(points, pool), pool, pair)
    if chosen.shortfall or chosen.gone or not chosen.picked:
        raise CheckpointNotFound(_refusal(source, run_dir, pool, chosen))
    picked = list(chosen.picked)
    if avg.state == "best" or (avg.state is None and isinstance(avg.selector, Best)):
        best = ranked([e for e in picked if e.pair == pair], pair[1])
        state = best[0] if best else picked[-1]
    else:
        state = picked[-1]
    return Resolved(source, run_dir / state.file, state, picked=tuple(picked))


def _refusal(
    source: Pair, run_dir: Path, pool: list[ManifestEntry], chosen: selection.Selection
) -> str:
    avg = source.pick
    assert isinstance(avg, Average)
    head = f"Cannot average {str(source)!r} in {str(run_dir)!r}: "
    kept = selection.describe_epochs([e.epoch for e in pool])
    if chosen.shortfall:
        return head + (
            f"{chosen.shortfall} (run {pool[0].run} holds epochs {kept}). Average fewer points, "
            "or train the run further."
        )
    recorded = pool[-1].keep  # the run's own keep, as its latest entry recorded it
    under = f" under keep={recorded}" if recorded else ""
    base = recorded[1:-1] if recorded else "Best(3), Last(1)"  # '(Best(3), Last(1))' -> selectors
    named = selection.describe_epochs([p.epoch for p in chosen.named])
    gone = selection.describe_epochs([p.epoch for p in chosen.gone])
    return head + (
        f"{avg.selector} names epochs {named} of run {pool[0].run}, which kept epochs {kept}"
        f"{under}; it no longer holds {gone}. Keep them while training: "
        f"Checkpointer(keep=({base}, {_keep_for(avg.selector)}))."
    )


def _keep_for(sel: Selector) -> str:
    if isinstance(sel, Best):
        return str(sel.among) if sel.among is not None else f"Best({sel.k})"
    return str(sel)


def check_keep_holds(ckpt: Checkpointer | None, avg: Average, max_epochs: int) -> None:
    """Setup refusal for ``restore_best=Average(...)``: refuse only a keep that cannot hold,
    at the end of a ``max_epochs`` run, everything the selector will name."""
    keep = ckpt.keep if ckpt is not None else ()
    if not selection.keep_holds(keep, avg.selector, max_epochs):
        current = ", ".join(map(str, keep))
        raise ConfigError(
            f"restore_best={avg} needs records that keep=({current}) does not hold at the end of "
            f"training (max_epochs={max_epochs}). Keep them: "
            f"Checkpointer(keep=({current}, {_keep_for(avg.selector)}))."
        )


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
    from nitro_core.resolve import resolve

    run_dir = Path(run_dir)
    src = to_source(source, "source")
    if not (isinstance(src, Pair) and isinstance(src.pick, Average)):
        raise ConfigError(
            f"average_checkpoints needs an Average, got {str(src)!r}; write e.g. "
            "'latest => Average(Last(10))'."
        )
    if save is not None:
        from nitro_core.export import refuse_existing

        refuse_existing(Path(save), "save=")
    result = average(resolve(src, run_dir, manifest.read_manifest(run_dir)), run_dir)
    if save is not None:
        from nitro_core.export import write_averaged

        write_averaged(result, Path(save))
    return result


def load_average(n: Nitro, source: Source, entries: list[ManifestEntry]) -> None:
    """``weights=... => Average(...)``: load the average into a new run."""
    from nitro_core.loading import load_model_state
    from nitro_core.resolve import resolve
    from nitro_core.restore import warn_config_changed

    resolved = resolve(source, n.run_dir, entries, n.ranking.pair)
    result = average(resolved, n.run_dir, load_ema=n.options.load_ema)
    warn_config_changed(result.meta, n, repr(str(source)))
    state = result.ema if n.options.load_ema else result.state
    load_model_state(n.model, state, n.options.strict, str(source), type(n.experiment).__name__)
    if n.ema is not None:
        n.ema.reset()
    n.checkpoint_source = resolved.path
    n.averaged_from = result.averaged_from


def restore_average(n: Nitro, avg: Average, entries: list[ManifestEntry]) -> Average | None:
    """``restore_best=Average(...)``: end training holding the run's own average."""
    from nitro_core.resolve import resolve

    source = Pair(RunRef("id", n.run_id), avg)
    try:
        resolved = resolve(source, n.run_dir, entries, n.ranking.pair)
    except CheckpointNotFound as exc:
        warnings.warn(
            f"restore_best={avg}: run {n.run_id} ended before it held enough checkpoints "
            f"({exc}); the handle keeps its final weights.",
            NitroWarning,
            stacklevel=4,
        )
        return None
    result = average(resolved, n.run_dir)
    n.model.load_state_dict(result.state)
    if n.ema is not None:
        if result.ema is not None:
            n.ema.load(result.ema, n.ema.num_updates)
        else:
            warnings.warn(
                f"restore_best={avg}: a picked record of run {n.run_id} keeps no EMA, so the "
                "handle keeps its final EMA beside the averaged weights.",
                NitroWarning,
                stacklevel=4,
            )
    n.averaged_from = result.averaged_from
    n.checkpoint_source = resolved.path
    return avg
