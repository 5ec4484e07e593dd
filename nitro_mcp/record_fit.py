"""Refusing at the call a record its job could not load.

A job that validates, averages with validation, or trains from ``weights=`` builds the
called experiment's model and loads the record into it; when the record was written by
another experiment (or under another architecture) that load fails in the worker, half a
minute later. The gate reads the record's header alone (``checkpoint_info``: the experiment
that wrote it, its layout's leaf names and shapes), has the called experiment's model built
on PyTorch's meta device (shapes without memory) in a child of the fork server, never in the
server (:mod:`nitro_core.jobs.probe`), and refuses a misfit at once with the
library's own words (``state.loading.check_fits``), naming the experiment that wrote the
record and the call to send instead. A model that cannot be built on the meta device, or a
record without a layout (an export), is left for the worker to check.

The same holds of what else the header says: ``load_ema=true`` on a record whose header has
no EMA section, and of an ``hf:`` directory, whose shards' headers name its tensors: one that
has no leaf in common with the model would load nothing (under ``strict=false`` either).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nitro_core.errors import ConfigError, NitroError
from nitro_core.experiment import Experiment
from nitro_core.info import checkpoint_info
from nitro_mcp.tool_calls import tool_call

Shapes = Callable[[Experiment], "dict[str, list[int]] | None"]  # a model's leaves and shapes


def check_record_fits(
    exp: Experiment, path: Path | str, strict: bool, origin: str, tool: str, args: dict[str, Any],
    registry: Mapping[str, type[Experiment]], shapes: Shapes, load_ema: bool = False,
) -> None:  # fmt: skip
    """Refuse ``path`` when its leaves do not fit ``exp``'s model (under ``strict``), naming
    the experiment that wrote it and ``tool``'s call under that experiment (``args`` are the
    call's arguments), or, with ``load_ema``, when it keeps no EMA. ``shapes(exp)`` gives the
    model's leaves, asked of a process of its own (:meth:`nitro_mcp.gate.Gate.shapes`): the
    server never builds the model."""
    from nitro_core.state.loading import check_fits  # lazy: it imports torch

    try:
        header = checkpoint_info(path)
    except (NitroError, OSError):  # unreadable: the resolution or the worker says why
        return
    if load_ema:
        _check_ema(header, origin, tool, args)
    record = record_shapes(header)
    model = shapes(exp) if record is not None else None
    if record is None or model is None:
        return
    name = type(exp).__name__
    try:
        check_fits(model, record, strict, origin, name)
    except ConfigError as exc:
        written = header.get("experiment")
        if not isinstance(written, str) or written.rsplit(".", 1)[-1] == name:
            raise
        raise ConfigError(
            *exc.parts, " ", writer_sentence(written, name, tool, args, registry)
        ) from None


def _check_ema(header: Mapping[str, Any], origin: str, tool: str, args: dict[str, Any]) -> None:
    """Refuse ``load_ema=true`` on a record whose header has no EMA section."""
    from nitro_core.state.records import is_export, keeps_ema  # lazy: it imports torch

    if keeps_ema(header):
        return
    written = str(header.get("experiment") or "its experiment").rsplit(".", 1)[-1]
    why = (
        "an export holds the parameters alone"
        if is_export(header)
        else f"{written}.ema() returned None when it was written"
    )
    again = tool_call(tool, {k: v for k, v in args.items() if k != "load_ema"})
    raise ConfigError(
        f"load_ema=true evaluates the EMA copy of the weights, but {origin!r} keeps no EMA "
        f"({why}). Drop load_ema to evaluate its parameters: {again}."
    )


def check_hf_fits(
    exp: Experiment, directory: Path, strict: bool, origin: str, tool: str, args: dict[str, Any],
    shapes: Shapes,
) -> None:  # fmt: skip
    """Refuse the Hugging Face directory ``directory`` (``origin``: the source as sent) when
    none of the tensors its shards' headers name is a leaf of ``exp``'s model (nothing would
    load), or when those it holds do not fit (a size, or under ``strict`` a leaf the model
    lacks). A leaf of the model the directory lacks is left to the worker: it may be a tied
    alias, which ``save_pretrained`` writes once and the load ties back."""
    from nitro_core.state.loading import check_fits  # lazy: it imports torch
    from nitro_core.store.hf import leaf_shapes  # lazy: it imports torch

    try:
        held = leaf_shapes(directory, origin)
    except (NitroError, OSError):  # unreadable: the worker says why
        return
    model = shapes(exp) if held else None
    if model is None:
        return
    name = type(exp).__name__
    if not set(held) & set(model):
        fresh = tool_call(tool, {k: v for k, v in args.items() if k not in ("weights", "strict")})
        raise ConfigError(
            f"weights={origin!r} does not fit {name}'s model: none of the {len(held)} tensors "
            f"the directory holds ({_names(sorted(held))}) is a leaf of the model "
            f"({_names(sorted(model))}), so nothing of it would load, with strict=false "
            f"either. Send weights= a directory of the model {name}.build_model() builds, or "
            f"train from fresh weights: {fresh}."
        )
    check_fits({k: v for k, v in model.items() if k in held}, held, strict, origin, name)


def _names(keys: list[str], limit: int = 4) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def writer_sentence(
    written: str, name: str, tool: str, args: dict[str, Any],
    registry: Mapping[str, type[Experiment]],
) -> str:  # fmt: skip
    """'It was written by Classifier, not Regression: send <call>.'"""
    registered = registered_name(written, registry)
    if registered is None:
        return (
            f"It was written by {written}, not {name}, and {written} is not registered here; "
            "nitro_experiments lists the experiments."
        )
    call = tool_call(tool, {**args, "experiment": registered})
    return f"It was written by {written}, not {name}: send experiment={registered!r}: {call}."


def registered_name(written: str, registry: Mapping[str, type[Experiment]]) -> str | None:
    """The registered name of the class a header names (``type(exp).__qualname__``)."""
    if written in registry:
        return written
    found = [n for n, cls in registry.items() if cls.__qualname__ == written]
    return found[0] if found else None


def record_shapes(header: Mapping[str, Any]) -> dict[str, list[int]] | None:
    """A record's leaves (parameters, buffers and tied aliases) and their shapes, from its
    header's layout; None for a header without one."""
    layout = header.get("layout")
    if not isinstance(layout, Mapping) or "params" not in layout:
        return None
    shapes = {str(row[0]): list(row[1]) for row in [*layout["params"], *layout.get("buffers", [])]}
    for alias, key in (layout.get("aliases") or {}).items():
        if key in shapes:
            shapes[str(alias)] = shapes[key]
    return shapes


def refuse_non_record(where: Path, path: str, shown_dir: str | None) -> None:
    """Refuse a file that is no Nitro record at all (a log, the manifest, any file that does
    not open with a safetensors header), saying what it is and what to pass instead; a
    ``.safetensors`` file that does not parse is left to the reader (it may be truncated)."""
    if not where.is_file() or where.suffix == ".safetensors" or _opens_as_safetensors(where):
        return
    if where.suffix == ".jsonl":
        what = "a JSONL log (a run's metric history: nitro_history reads it)"
    elif where.name == "manifest.json":
        what = "a run directory's manifest (nitro_manifest reads it)"
    elif where.suffix == ".json":
        what = "a JSON file"
    else:
        what = (
            f"a file of {where.stat().st_size} bytes that does not open with a safetensors header"
        )
    lists = (
        f"nitro_manifest(run_dir={shown_dir!r}) lists its records"
        if shown_dir is not None
        else "nitro_manifest(run_dir=...) lists a run's records"
    )
    raise ConfigError(
        f"path={path!r} is not a Nitro record: it is {what}. Pass a record instead, a "
        f".safetensors file or a record directory (holding header.json); {lists}."
    )


def _opens_as_safetensors(path: Path) -> bool:
    """Whether the file starts as a safetensors file does: an 8-byte little-endian header
    length that fits the file, then a JSON object."""
    with path.open("rb") as f:
        head = f.read(9)
    if len(head) < 9:
        return False
    return 8 + int.from_bytes(head[:8], "little") <= path.stat().st_size and head[8:9] == b"{"
