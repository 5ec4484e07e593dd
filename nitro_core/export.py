"""Weights exports: parameters and layer state under their state-dict names, with
provenance, through the one record writer. Takes a handle (anything that is
:class:`Exportable`, as ``Nitro`` is: this layer sits below the handle and never imports
it) or a source resolved from the manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from nitro_core.averaging import average
from nitro_core.sources.grammar import to_source
from nitro_core.sources.lookup import (
    copied,
    home_of,
    resolve_at,
    run_of,
    shown_record,
    weights_copies,
)
from nitro_core.state.loading import WEIGHTS, read
from nitro_core.state.records import FORMAT_VERSION, framework_version, model_layout, to_host
from nitro_core.store import recordio as store
from nitro_core.store.objects import ObjectPath
from nitro_core.store.place import place


@runtime_checkable
class Exportable(Protocol):
    """What an export reads of a trained handle (``Nitro`` is one)."""

    model: torch.nn.Module
    experiment: Any  # an Experiment (a pydantic model: its config is model_dump()'s)
    run_id: str
    seed: int
    epoch: int
    step: int
    batch: int | None
    history: list[dict[str, Any]]  # a row per point it trained through
    store: Any  # its run directory (a RunStore)
    checkpoint_source: Path | str | None
    averaged_from: dict[str, Any] | None
    held: Any  # what restore_best left in the model (training.restore.Held), or None


def export_weights(
    nitro_or_source: Exportable | Any, path: str | Path, run_dir: str | Path | None = None
) -> Path | ObjectPath:
    """Write parameters and layer state alone, under their state-dict names, so that
    ``model.load_state_dict(safetensors.torch.load_file(path))`` restores them. The header's
    ``nitro`` metadata holds the provenance: source file, ``averaged_from``, config, seed and
    framework version."""
    target = place(path, "path")
    target.refuse_taken("Export path")
    state, provenance, _ = weights_of(nitro_or_source, run_dir, "export_weights")
    provenance.update(
        kind="weights", format_version=FORMAT_VERSION, framework_version=framework_version()
    )
    tensors = {k: to_host(v) for k, v in state.items()}

    def write(target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        store.write_record(target, tensors, provenance)

    return target.write_new("Export path", write)


def weights_of(
    nitro_or_source: Exportable | Any,
    run_dir: str | Path | None,
    call: str = "export_weights",
    target: str = "path",
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """What an export writes: the state dict (tied names share one tensor), its provenance,
    and the header it came from (a handle's: its layout). ``call`` and ``target`` (its
    second argument) name the caller in a refusal (``export_weights``, ``export_hf``)."""
    if isinstance(nitro_or_source, Exportable):
        n = nitro_or_source
        source, run, epoch, step = _held(n)
        provenance = {
            "source_file": str(source) if source else None,
            "averaged_from": n.averaged_from,
            "experiment": type(n.experiment).__qualname__,
            "config": n.experiment.model_dump(mode="json"),
            "seed": n.seed,
            "run": run,
            "epoch": epoch,
            "step": step,
        }
        return n.model.state_dict(), provenance, {"layout": model_layout(n.model, None)}
    return _from_source(nitro_or_source, run_dir, call, target)


def _held(n: Exportable) -> tuple[Path | str | None, str, int, int]:
    """The record a handle's weights are (None: none holds them), and the run, epoch and
    step of that state: what ``restore_best`` left; else, once the handle trained, its own
    record at its last point (None when it wrote none or retention dropped it), not the
    file it started from; else what it loaded (``weights=``, ``resume=``)."""
    if n.held is not None:
        return n.held.record, n.held.run, n.held.epoch, n.held.step
    if not n.history:  # nothing trained since the load
        return n.checkpoint_source, n.run_id, n.epoch, n.step
    last = [
        e
        for e in n.store.entries()
        if (e.run, e.epoch, e.step, e.batch) == (n.run_id, n.epoch, n.step, n.batch)
    ]
    return (n.store.record(last[-1].file) if last else None), n.run_id, n.epoch, n.step


def _from_source(
    source: Any, run_dir: str | Path | None, call: str, target: str
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    src = to_source(source, "source")
    run = run_of(src, run_dir, call + "({src}, ...)",
                 call + "({src}, " + target + ", run_dir='runs/MyExp')")  # fmt: skip
    home, _ = home_of(src, run)
    # on object storage: the weights sections alone, fetched below
    resolved = resolve_at(src, run, copy=False)
    averaged_from: dict[str, Any] | None
    if src.averaged() is not None:  # the picks' weights, in copies removed after
        with weights_copies(home, resolved, WEIGHTS) as (here, private):
            result = average(here, private, shown=str(home))
        meta, state, averaged_from = result.meta, result.state, result.averaged_from
    else:
        record = read(copied(home, resolved, WEIGHTS), WEIGHTS)  # no optimizer bytes
        meta, state = record.meta, record.model_state()
        averaged_from = meta.get("averaged_from")
    return (
        state,
        {
            "source_file": str(shown_record(home, resolved.path)),
            "averaged_from": averaged_from,
            "experiment": meta.get("experiment"),
            "config": meta.get("config"),
            "seed": meta.get("seed"),
            "run": meta.get("run"),
            "epoch": meta.get("epoch"),
            "step": meta.get("step"),
        },
        meta,
    )
