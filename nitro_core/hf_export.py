"""``export_hf``: a run's weights as a directory ``transformers``' ``from_pretrained(dir)``
loads (DESIGN.md section 15). The weights come from the one export path
(:func:`nitro_core.export.weights_of`: a handle, a record, an ``Average``, a record
directory, an ``hf:`` directory); the directory is written and published whole by
:func:`nitro_core.store.hf.write_dir`.

The config (given as a dict or a ``PretrainedConfig``, else the model's own ``.config``) is
checked against the weights before a byte is written: the model it describes is built on
PyTorch's meta device (shapes, no memory) and each leaf's shape compared. That model also
says which names are tied (one parameter under two names, ``lm_head.weight`` beside the
token embedding): as ``save_pretrained`` does, the file keeps the first name and leaves the
others out, and ``from_pretrained`` ties them back. ``transformers`` is imported here only
when an export runs (the extra ``nitro[hf]``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nitro_core.errors import ConfigError
from nitro_core.experiment import Experiment
from nitro_core.export import Exportable, weights_of
from nitro_core.registry import builtin_experiments
from nitro_core.state.records import FORMAT_VERSION, framework_version, to_host
from nitro_core.store import hf
from nitro_core.training.from_record import RecordConfig, build_from_config


@dataclass(frozen=True)
class ConfigFix:
    """What a caller can write instead when export_hf finds no config for a recorded source:
    when its experiment is not registered, and when its model is not a transformers model."""

    unregistered: str
    not_transformers: str


_WRITE = "Write export_hf(source, out_dir, config=GPT2Config(...)) or config=n.model.config."
PYTHON_FIX = ConfigFix(_WRITE, _WRITE)
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def export_hf(
    source: Exportable | Any,
    out_dir: str | Path,
    *,
    config: Mapping[str, Any] | Any | None = None,
    dtype: torch.dtype | str | None = None,
    max_shard_size: int | str = "5GB",
    run_dir: str | Path | None = None,
) -> Path:
    """Write ``source``'s weights as a Hugging Face model directory at ``out_dir`` (which
    must not exist): ``config.json``, ``model.safetensors`` (or shards of at most
    ``max_shard_size`` with ``model.safetensors.index.json``) and ``nitro_provenance.json``.
    Floating tensors are cast to ``dtype`` only when it is given. Returns ``out_dir``."""
    return export_hf_using(
        None, source, out_dir, config=config, dtype=dtype, max_shard_size=max_shard_size,
        run_dir=run_dir,
    )  # fmt: skip


def export_hf_using(
    experiments: Mapping[str, type[Experiment]] | None,
    source: Exportable | Any,
    out_dir: str | Path,
    *,
    config: Mapping[str, Any] | Any | None = None,
    dtype: torch.dtype | str | None = None,
    max_shard_size: int | str = "5GB",
    run_dir: str | Path | None = None,
    fix: ConfigFix = PYTHON_FIX,
) -> Path:
    """:func:`export_hf`, where a recorded experiment (whose model's ``.config`` is written
    when ``config`` is None) is looked up in ``experiments`` (the MCP server's registry, its
    ``--experiment-module`` classes included; None: the examples and entry points), and a
    refusal for want of a config ends with ``fix``, what the caller can write instead."""
    out = Path(out_dir)
    hf.refuse_existing_dir(out)  # before any record is read
    limit = hf.parse_size(max_shard_size)
    cast = _dtype(dtype)
    transformers = _transformers()
    state, provenance, meta = weights_of(source, run_dir, "export_hf", "out_dir")
    body = _config_dict(config, source, provenance, transformers, experiments, fix)
    model = _meta_model(body, transformers)
    _check_fits(model, state, body)
    if not body.get("architectures"):  # as save_pretrained writes it: the class that loads it
        body["architectures"] = [type(model).__name__]
    tied = _tied(model)
    if cast is not None:
        body["dtype"] = str(cast).removeprefix("torch.")
        body.pop("torch_dtype", None)
    tensors = {
        k: to_host(v.to(cast) if cast is not None and v.is_floating_point() else v)
        for k, v in state.items()
        if k not in tied
    }
    provenance.update(
        kind="hf",
        format_version=FORMAT_VERSION,
        framework_version=framework_version(),
        dtype=None if cast is None else body["dtype"],
        tied=dict(sorted(tied.items())),
    )
    hf.write_dir(out, tensors, body, provenance, limit)
    return out


def _transformers() -> Any:
    try:
        import transformers  # lazy: the optional extra nitro[hf]
    except ImportError:
        raise ConfigError(
            "export_hf writes a directory for transformers, and transformers is not installed; "
            "install the extra: pip install 'nitro[hf]'."
        ) from None
    return transformers


def _dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None:
        return None
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ConfigError(
            f"dtype={dtype!r} is not a floating dtype export_hf writes; write one of "
            f"{sorted(DTYPES)} (e.g. dtype='bfloat16'), or leave dtype out to keep the weights' own."
        )
    return DTYPES[name]


def _config_dict(
    config: Any,
    source: Any,
    provenance: Mapping[str, Any],
    transformers: Any,
    experiments: Mapping[str, type[Experiment]] | None,
    fix: ConfigFix,
) -> dict[str, Any]:
    """``config.json``'s content: the given dict or ``PretrainedConfig``, else the model's
    own ``.config`` (the handle's model, or the recorded experiment's, built on meta)."""
    if config is None:
        config = _own_config(source, provenance, experiments, fix)
    if isinstance(config, transformers.PretrainedConfig):
        body = json.loads(config.to_json_string(use_diff=False))
    elif isinstance(config, Mapping):
        body = json.loads(json.dumps(dict(config)))  # plain JSON: a copy the caller keeps
    else:
        raise ConfigError(
            f"config={type(config).__name__} is neither a dict nor a transformers "
            "PretrainedConfig; write config=GPT2Config(...), config=model.config or "
            "config={'model_type': 'gpt2', ...}."
        )
    if "model_type" not in body:
        raise ConfigError(
            f"config={_clip(body)} has no 'model_type', so transformers cannot tell which model "
            "it describes; write config=GPT2Config(...) or add 'model_type' (e.g. 'gpt2', 'llama')."
        )
    return body


def _own_config(
    source: Any,
    provenance: Mapping[str, Any],
    experiments: Mapping[str, type[Experiment]] | None,
    fix: ConfigFix,
) -> Any:
    if isinstance(source, Exportable):
        found = getattr(source.model, "config", None)
        if found is not None and hasattr(found, "to_json_string"):
            return found
        raise ConfigError(
            f"export_hf needs config=: the model of {type(source.experiment).__name__} is a "
            f"{type(source.model).__name__}, not a transformers model with a .config. Write "
            "export_hf(n, out_dir, config=GPT2Config(...)) (a dict works too)."
        )
    name = provenance.get("experiment")
    cls = _recorded_class(str(name), experiments) if name else None
    if cls is not None:
        recorded = RecordConfig(
            Path(str(provenance.get("source_file"))), name, provenance.get("config")
        )
        exp, _ = build_from_config(cls, recorded, {})
        with torch.device("meta"):
            model = exp.build_model()
        found = getattr(model, "config", None)
        if found is not None and hasattr(found, "to_json_string"):
            return found
        raise ConfigError(
            f"export_hf needs config= for {str(source)!r}: the model of its experiment {name} is "
            f"a {type(model).__name__}, not a transformers model with a .config. "
            f"{fix.not_transformers}"
        )
    raise ConfigError(
        f"export_hf needs config= for {str(source)!r}: its experiment ({name or 'none recorded'}) "
        f"is not a registered experiment, so its model's config is unknown. {fix.unregistered}"
    )


def _recorded_class(
    name: str, experiments: Mapping[str, type[Experiment]] | None
) -> type[Experiment] | None:
    """The class a record's ``experiment`` (a class's ``__qualname__``) names: registered
    under that name, or under ``<module>.<name>`` when another class took the name."""
    classes = builtin_experiments()[0] if experiments is None else experiments
    short = name.rsplit(".", 1)[-1]
    if name in classes:
        return classes[name]
    matches = [c for c in classes.values() if c.__qualname__ in (name, short)]
    return matches[0] if len(matches) == 1 else classes.get(short)


def _meta_model(body: Mapping[str, Any], transformers: Any) -> torch.nn.Module:
    """The model ``body`` describes, on the meta device (what from_pretrained will build)."""
    try:
        cfg = transformers.AutoConfig.for_model(**body)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"config={_clip(body)} is not a transformers config ({exc}); write "
            "config=GPT2Config(...) or the dict such a config's to_dict() gives."
        ) from None
    arches = body.get("architectures") or []
    cls = getattr(transformers, arches[0], None) if arches else None
    with torch.device("meta"):
        if cls is not None:
            model: torch.nn.Module = cls(cfg)
        else:
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model


def _check_fits(model: torch.nn.Module, state: Mapping[str, torch.Tensor], body: Any) -> None:
    """Refuse a config whose model does not take these weights, naming the leaf and shapes."""
    wanted = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    name = type(model).__name__
    fix = (
        "Pass the config the model was trained with (config=n.model.config), or leave config "
        "out to use the model's own."
    )
    for key, t in state.items():
        if key in wanted and wanted[key] != tuple(t.shape):
            raise ConfigError(
                f"export_hf: the config does not fit the weights: leaf {key!r} has size "
                f"{list(t.shape)} in the weights and {list(wanted[key])} in the {name} the "
                f"config describes. {fix}"
            )
    missing = [k for k in wanted if k not in state]
    extra = [k for k in state if k not in wanted]
    if missing or extra:
        parts = [f"the weights lack {missing[:4]}"] if missing else []
        parts += [f"they hold {extra[:4]}, which the {name} lacks"] if extra else []
        raise ConfigError(
            f"export_hf: the config does not fit the weights: {' and '.join(parts)} (the "
            f"config describes a {name}). {fix}"
        )


def _tied(model: torch.nn.Module) -> dict[str, str]:
    """Alias -> the name kept, for each parameter the model holds under several names (the
    first name in the state dict is kept, as save_pretrained keeps it)."""
    first: dict[int, str] = {}
    tied: dict[str, str] = {}
    for key, t in model.state_dict(keep_vars=True).items():
        if id(t) in first:
            tied[key] = first[id(t)]
        else:
            first[id(t)] = key
    return tied


def _clip(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
