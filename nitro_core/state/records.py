"""The record layout: a training state <-> (flat host tensors, JSON header). Pure: no I/O.

Tensors live under the prefixes ``params/`` and ``buffers/`` (state-dict keys), ``optim/``
(optimizer state; ``optim/scheduler/`` and ``optim/plateau/`` for the schedules), ``ema/``
(the EMA's copy of every state-dict key) and ``rng/``. Everything else is JSON in the
header: step, epoch, seed, run, config, metrics, stop_reason, the parameter layout,
non-tensor optimizer and scheduler state, Python and NumPy RNG state, logger state.

Nested state (an optimizer's ``state_dict()``) is stored by a small tree codec: tensors are
replaced by ``{"__tensor__": "<name>"}``; tuples, and dicts whose keys are not plain
strings, are tagged so they come back as they went in. Nothing is pickled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from nitro_core._version import __version__
from nitro_core.errors import RecordError

FORMAT_VERSION = 2  # 2: the header carries its own digest (store.digest.HEADER_DIGEST_SINCE)
PREFIXES = ("params/", "buffers/", "optim/", "ema/", "rng/")


def framework_version() -> str:
    return __version__


def to_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached and on the host. A host tensor is not copied (a synchronous write ends
    before the next step changes it; an asynchronous one copies every leaf into its own host
    buffers through :func:`encode`'s ``leaf``); a ``meta`` leaf has no data to copy and is
    passed through so the writer refuses it by name."""
    t = t.detach()
    if t.device.type in ("cpu", "meta"):
        return t
    return t.cpu()


Leaf = Callable[[str, torch.Tensor], torch.Tensor]  # (record name, live tensor) -> host tensor


def host_leaf(name: str, t: torch.Tensor) -> torch.Tensor:
    """The default :data:`Leaf`: :func:`to_host`."""
    return to_host(t)


# -- the tree codec --------------------------------------------------------------------------
def encode_tree(
    obj: Any, prefix: str, tensors: dict[str, torch.Tensor], leaf: Leaf = host_leaf
) -> Any:
    """JSON for ``obj``, moving its tensors (through ``leaf``) into ``tensors`` under
    ``prefix``."""
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = leaf(prefix, obj)
        return {"__tensor__": prefix}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, tuple):
        return {
            "__tuple__": [encode_tree(v, f"{prefix}/{i}", tensors, leaf) for i, v in enumerate(obj)]
        }
    if isinstance(obj, list):
        return [encode_tree(v, f"{prefix}/{i}", tensors, leaf) for i, v in enumerate(obj)]
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: encode_tree(v, f"{prefix}/{k}", tensors, leaf) for k, v in obj.items()}
        return {
            "__items__": [
                [encode_tree(k, "", {}), encode_tree(v, f"{prefix}/{k}", tensors, leaf)]
                for k, v in obj.items()
            ]
        }
    raise RecordError(
        f"Record leaf {prefix!r} holds a {type(obj).__name__}, which a record cannot store "
        "without pickle; keep tensors, numbers, strings, lists and dicts in state_dict()."
    )


def decode_tree(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The inverse of :func:`encode_tree`."""
    if isinstance(obj, list):
        return [decode_tree(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__tuple__" in obj:
            return tuple(decode_tree(v, tensors) for v in obj["__tuple__"])
        if "__items__" in obj:
            return {decode_tree(k, tensors): decode_tree(v, tensors) for k, v in obj["__items__"]}
        return {k: decode_tree(v, tensors) for k, v in obj.items()}
    return obj


# -- the model ---------------------------------------------------------------------------------
def model_layout(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Names, shapes and dtypes of parameters and buffers, tied aliases, optimizer groups."""
    state = model.state_dict(keep_vars=True)
    param_names = {id(p): n for n, p in model.named_parameters()}
    canonical: dict[int, str] = {}
    aliases: dict[str, str] = {}
    params: list[list[Any]] = []  # [name, shape, dtype] rows
    buffers: list[list[Any]] = []
    for key, t in state.items():
        if id(t) in canonical:
            aliases[key] = canonical[id(t)]
            continue
        canonical[id(t)] = key
        row = [key, list(t.shape), str(t.dtype).removeprefix("torch.")]
        (params if id(t) in param_names else buffers).append(row)
    groups = []
    if optimizer is not None:
        for group in optimizer.param_groups:
            groups.append(
                [param_names.get(id(p), f"<unnamed {tuple(p.shape)}>") for p in group["params"]]
            )
    return {"params": params, "buffers": buffers, "aliases": aliases, "groups": groups}


def model_tensors(
    model: torch.nn.Module,
    layout: Mapping[str, Any],
    prefix_params: str = "params/",
    prefix_buffers: str = "buffers/",
    leaf: Leaf = host_leaf,
) -> dict[str, torch.Tensor]:
    """The model's state as host tensors under the params/ and buffers/ prefixes."""
    state = model.state_dict()
    out = {}
    for prefix, kind in ((prefix_params, "params"), (prefix_buffers, "buffers")):
        for k, _, _ in layout[kind]:
            out[f"{prefix}{k}"] = leaf(f"{prefix}{k}", state[k])
    return out


def state_dict_from(
    tensors: Mapping[str, torch.Tensor], layout: Mapping[str, Any], prefix: str | None = None
) -> dict[str, torch.Tensor]:
    """A model state dict from a record (``prefix="ema/"`` for the EMA's copy)."""
    out: dict[str, torch.Tensor] = {}
    for kind in ("params", "buffers"):
        for key, _, _ in layout[kind]:
            out[key] = tensors[f"{prefix or kind + '/'}{key}"]
    for alias, key in layout.get("aliases", {}).items():
        out[alias] = out[key]
    return out


def weights_tensors(
    state: Mapping[str, torch.Tensor],
    ema: Mapping[str, torch.Tensor] | None,
    layout: Mapping[str, Any],
) -> dict[str, torch.Tensor]:
    """A weights-only record's tensors (``params/``, ``buffers/``, and ``ema/`` when given)
    from state dicts, under ``layout`` (tied aliases stored once)."""
    out: dict[str, torch.Tensor] = {}
    for kind in ("params", "buffers"):
        for key, _, _ in layout[kind]:
            out[f"{kind}/{key}"] = to_host(state[key])
            if ema is not None:
                out[f"ema/{key}"] = to_host(ema[key])
    return out


# -- the whole record --------------------------------------------------------------------------
@dataclass
class Snapshot:
    """Everything one record holds, gathered by the handle."""

    header: dict[str, Any]
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    trees: dict[str, Any] = field(default_factory=dict)  # section -> state (scheduler, ...)
    ema: Mapping[str, torch.Tensor] | None = None
    rng_tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)


TREE_PREFIXES = {
    "optimizer": "optim",
    "scheduler": "optim/scheduler",
    "plateau": "optim/plateau",
    "data": "rng/data",  # the train split's state_dict() at a mid-epoch record
    "stateful": "stateful",  # the experiment's own components (Experiment.stateful)
}


def encode(
    snap: Snapshot, leaf: Leaf = host_leaf
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, header) for a snapshot; every tensor a host tensor, made by ``leaf`` (the
    asynchronous writer's copies the live tensors into host buffers it owns)."""
    layout = model_layout(snap.model, snap.optimizer)
    tensors = model_tensors(snap.model, layout, leaf=leaf)
    meta = dict(snap.header)
    meta["format_version"] = FORMAT_VERSION
    meta["framework_version"] = framework_version()
    meta["layout"] = layout
    meta["optimizer"] = encode_tree(snap.optimizer.state_dict(), "optim", tensors, leaf)
    meta["optimizer_class"] = type(snap.optimizer).__name__
    for section, state in snap.trees.items():
        prefix = TREE_PREFIXES.get(section, f"optim/{section}")
        meta[section] = encode_tree(state, prefix, tensors, leaf)
    if snap.ema is not None:
        tensors.update({f"ema/{k}": leaf(f"ema/{k}", v) for k, v in snap.ema.items()})
    tensors.update({f"rng/{k}": leaf(f"rng/{k}", v) for k, v in snap.rng_tensors.items()})
    return tensors, meta


def is_export(meta: Mapping[str, Any]) -> bool:
    """Whether a header is an ``export_weights`` file's: plain state-dict keys, no layout."""
    return meta.get("kind") == "weights" and "layout" not in meta


def keeps_ema(meta: Mapping[str, Any]) -> bool:
    """Whether the record a header describes keeps an EMA copy of its weights (``ema/``):
    its experiment's ``ema()`` returned one when it was written (an export keeps none)."""
    return not is_export(meta) and meta.get("ema_meta") is not None


@dataclass
class Record:
    """A record read back: its header and tensors, with accessors for each part. An export
    (``export_weights``) reads as a record whose model state is its tensors, by their keys."""

    meta: dict[str, Any]
    tensors: dict[str, torch.Tensor]

    @property
    def layout(self) -> dict[str, Any]:
        return self.meta["layout"]

    def model_state(self) -> dict[str, torch.Tensor]:
        if is_export(self.meta):
            return dict(self.tensors)
        return state_dict_from(self.tensors, self.layout)

    def ema_state(self) -> dict[str, torch.Tensor] | None:
        if is_export(self.meta) or not any(k.startswith("ema/") for k in self.tensors):
            return None
        return state_dict_from(self.tensors, self.layout, prefix="ema/")

    def tree(self, section: str) -> Any:
        value = self.meta.get(section)
        return None if value is None else decode_tree(value, self.tensors)

    def rng_tensors(self, under: str = "rng/") -> dict[str, torch.Tensor]:
        """The tensors under ``under``, by the rest of their names (``"rng/epoch/"``: the
        generators at the start of a mid-epoch record's epoch)."""
        return {k.removeprefix(under): v for k, v in self.tensors.items() if k.startswith(under)}
