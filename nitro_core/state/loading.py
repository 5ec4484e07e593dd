"""Reading a resolved record (one header parse, only the sections asked for), and loading
its tensors into live objects: parameters and layer state (strict or by name), an EMA's
copy, and an optimizer's state under a fresh schedule. Every refusal names the leaf and
both sizes."""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from nitro_core.errors import ConfigError, NitroWarning, arg
from nitro_core.sources.resolve import Resolved
from nitro_core.state.records import Record
from nitro_core.store import hf
from nitro_core.store import recordio as store

WEIGHTS = ("params", "buffers", "ema", "tensors")  # the sections a weights load reads


def read(resolved: Resolved, sections: Collection[str] | None = None) -> Record:
    """A resolved record's header and tensors (those of ``sections``, or all: ``WEIGHTS``
    for parameters, layer state and EMA, never the optimizer's bytes), made straight from
    the file in one pass: the header is checked against the manifest's digest when the
    record is listed, and each section read against the header's digest of it."""
    if resolved.source.hf_directory() is not None:  # plain state-dict keys, read as an export
        tensors, provenance = hf.read_dir(resolved.path, str(resolved.source))
        return Record(meta=hf_meta(provenance), tensors=tensors)
    tensors, meta = store.read_record(
        resolved.path, resolved.entry.expected if resolved.entry else None, sections
    )
    return Record(meta=meta, tensors=tensors)


def hf_meta(provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The header a Hugging Face directory reads as: an export's (``kind="weights"``, no
    layout), with the ``averaged_from`` and run its ``nitro_provenance.json`` names."""
    return {
        "kind": "weights",
        "averaged_from": provenance.get("averaged_from"),
        "run": provenance.get("run"),
        "config": None,  # a transformers config is no experiment's: nothing to compare
    }


def tie_aliases(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``state`` with each tied alias of ``model`` that it lacks (``lm_head.weight`` beside
    ``transformer.wte.weight``: one parameter under two names) taken from the name it holds,
    as transformers' ``save_pretrained`` leaves it out and ``from_pretrained`` ties it back."""
    names: dict[int, list[str]] = {}
    for key, t in model.state_dict(keep_vars=True).items():
        names.setdefault(id(t), []).append(key)
    out = dict(state)
    for group in names.values():
        held = next((k for k in group if k in out), None)
        if held is not None:
            out.update({k: out[held] for k in group if k not in out})
    return out


def load_model_state(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor], strict: bool, origin: str, owner: str
) -> None:
    """Load ``state`` into ``model``. A size mismatch always refuses; with ``strict=False`` a
    leaf missing from ``state`` keeps its fresh value and an extra one is dropped, both with
    a warning."""
    current = model.state_dict()
    missing, extra = check_fits(
        {k: v.shape for k, v in current.items()}, {k: v.shape for k, v in state.items()},
        strict, origin, owner,
    )  # fmt: skip
    if missing:
        warnings.warn(
            f"strict=False: {_names(missing)} not in {origin!r}; they keep their fresh values.",
            NitroWarning,
            stacklevel=4,
        )
    if extra:
        warnings.warn(
            f"strict=False: {_names(extra)} in {origin!r} match no leaf of the model; dropped.",
            NitroWarning,
            stacklevel=4,
        )
    model.load_state_dict({k: v for k, v in state.items() if k in current}, strict=False)


def check_fits(
    model: Mapping[str, Sequence[int]], record: Mapping[str, Sequence[int]], strict: bool,
    origin: str, owner: str,
) -> tuple[list[str], list[str]]:  # fmt: skip
    """Refuse a record whose leaves (name -> shape) do not fit the model's: a size mismatch
    always, a missing or extra leaf under ``strict``. Returns (missing, extra) names. Pure,
    so the gate checks a record's header against a model built on the meta device."""
    for key, shape in record.items():
        if key in model and tuple(model[key]) != tuple(shape):
            raise ConfigError(
                f"Checkpoint {origin!r} does not fit {owner}'s model: leaf {key!r} has size "
                f"{list(shape)} in the record and {list(model[key])} in the model. "
                "Build the model the record was written with (same config), or train a new run."
            )
    missing = [k for k in model if k not in record]
    extra = [k for k in record if k not in model]
    if strict and (missing or extra):
        parts = []
        if missing:
            parts.append(f"the record lacks {_names(missing)}")
        if extra:
            parts.append(f"it has {_names(extra)} that the model lacks")
        raise ConfigError(
            f"Checkpoint {origin!r} does not fit {owner}'s model: {' and '.join(parts)}. Build "
            "the model the record was written with, or pass ",
            arg("strict", False),
            " to load the leaves that match by name (missing ones keep their fresh values, extra "
            "ones are dropped).",
        )
    return missing, extra


def fresh_schedule(optimizer: torch.optim.Optimizer, recorded: dict[str, Any]) -> dict[str, Any]:
    """The optimizer ``state_dict`` for ``restore_optimizer=True``: the record's per-parameter
    state (its moments) under this optimizer's hyperparameters (learning rate, betas, ...),
    a fresh schedule over the old moments."""
    fresh = optimizer.state_dict()["param_groups"]
    groups = recorded["param_groups"]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in fresh]:
        raise ConfigError(
            arg("restore_optimizer", True),
            ": the record's optimizer groups hold "
            f"{[len(g['params']) for g in groups]} parameters, this optimizer's "
            f"{[len(g['params']) for g in fresh]}. Build the optimizer with the same groups, or "
            "drop restore_optimizer.",
        )
    merged = [{**f, "params": g["params"]} for f, g in zip(fresh, groups)]
    return {"state": recorded["state"], "param_groups": merged}


def _names(keys: list[str], limit: int = 6) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
