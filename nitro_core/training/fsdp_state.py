"""Loading whole (unsharded) state into an FSDP2 model and its optimizer, through
``torch.distributed.checkpoint.state_dict``: each rank keeps its own pieces of every
tensor, whatever number of processes wrote the record."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from nitro_core.errors import CheckpointCorrupt
from nitro_core.state import records
from nitro_core.store import shards
from nitro_core.training.distributed import Dist


def fqn_optimizer_state(osd: Mapping[str, Any], layout: Mapping[str, Any]) -> dict[str, Any]:
    """An optimizer ``state_dict()`` (parameters numbered across its groups, as torch
    writes it) keyed by parameter name instead, as DCP's ``set_optimizer_state_dict`` takes
    it. ``layout["groups"]`` names each group's parameters in order."""
    names = [name for group in layout["groups"] for name in group]
    state = {names[int(i)]: v for i, v in osd.get("state", {}).items()}
    groups = [{**g, "params": [names[int(i)] for i in g["params"]]} for g in osd["param_groups"]]
    return {"state": state, "param_groups": groups}


def load(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: Mapping[str, torch.Tensor],
    optimizer_state: Mapping[str, Any],
    meta: Mapping[str, Any],
) -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, dict(model_state), options=options)
    load_optimizer(model, optimizer, optimizer_state, meta)


def load_optimizer(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    optimizer_state: Mapping[str, Any],
    meta: Mapping[str, Any],
) -> None:
    """A whole optimizer ``state_dict`` (as a record holds it, parameters numbered) into the
    optimizer of an FSDP2 model: each rank keeps its pieces of every moment."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    state = fqn_optimizer_state(optimizer_state, meta["layout"])
    set_optimizer_state_dict(
        model, optimizer, state, options=StateDictOptions(full_state_dict=True)
    )


def placed(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (whole tensors) laid out like ``model``'s own: each entry whose live tensor
    is an FSDP2 DTensor becomes a DTensor on the same mesh and placements, sliced locally
    (every rank holds the whole tensor, so nothing is sent). The entries of a plain model
    come back as they are."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    live = model.state_dict()
    out = dict(state)
    for key, value in state.items():
        target = live.get(key)
        if isinstance(target, DTensor) and not isinstance(value, DTensor):
            out[key] = distribute_tensor(
                value.to(target.device), target.device_mesh, target.placements, src_data_rank=None
            )
    return out


PIECES = ("params/", "buffers/", "ema/", "optim/state/")  # tensors each rank reads its part of


def read_pieces(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    ema: Mapping[str, torch.Tensor] | None,
    path: Path,
    expected: str | None,
    d: Dist,
) -> records.Record:
    """A sharded record read as an FSDP rank resumes it: each rank checks its share of the
    shard files against the header (the ranks agree on the verdict before reading on), then
    one DCP load fills, on every rank, only this rank's pieces of the parameters, buffers,
    EMA copy and optimizer moments, straight into the live tensors (resharded when another
    number of processes wrote it), and the small tensors (generators, schedules) whole.
    Returns the record, whose tensors are those, for the usual resume path."""
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load

    failure: CheckpointCorrupt | None = None
    try:
        shards.verify(path, expected, part=(d.rank, d.world))
    except CheckpointCorrupt as exc:
        failure = exc
    if d.any(failure is not None):  # every rank stops here, before any collective read
        raise failure or CheckpointCorrupt(
            f"Checkpoint {str(path)!r}: another rank found a shard that does not match the "
            "digest its header gives (its traceback names it). Load another checkpoint."
        )
    meta = shards.read_header(path)
    get_optimizer_state_dict(model, optimizer)  # makes the moments exist (a zero-lr step)
    snap = records.Snapshot(header={}, model=model, optimizer=optimizer, ema=ema)
    live, _ = records.encode(snap, leaf=lambda name, t: t.detach())
    template: dict[str, torch.Tensor] = {k: v for k, v in live.items() if k.startswith(PIECES)}
    metadata = HuggingFaceStorageReader(str(path)).read_metadata()
    small = {
        name: torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for name, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata) and not name.startswith(PIECES)
    }
    load({**template, **small}, storage_reader=HuggingFaceStorageReader(str(path)))
    return records.Record(meta=meta, tensors={**small, **template})
