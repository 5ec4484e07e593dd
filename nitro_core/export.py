"""Writing parameters out: averaged records (``average_checkpoints(save=...)``) and weights
exports with provenance, both through the one record writer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nitro_core import manifest, store
from nitro_core.errors import ConfigError
from nitro_core.records import FORMAT_VERSION, framework_version, to_host, weights_tensors

if TYPE_CHECKING:
    from nitro_core.averaging import Averaged
    from nitro_core.handle import Nitro


def refuse_existing(path: Path, what: str) -> None:
    if path.suffix != ".safetensors":
        raise ConfigError(
            f"{what} {str(path)!r} must name a .safetensors file (sources find records by that "
            "suffix), e.g. 'runs/my_run/avg10.safetensors'."
        )
    if path.exists():
        raise ConfigError(
            f"{what} {str(path)!r} already exists; Nitro never overwrites it. Choose a new name, "
            "or delete the old file first."
        )


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


def export_weights(
    nitro_or_source: Nitro | Any, path: str | Path, run_dir: str | Path | None = None
) -> Path:
    """Write parameters and layer state alone, under their state-dict names, so that
    ``model.load_state_dict(safetensors.torch.load_file(path))`` restores them. The header's
    ``nitro`` metadata holds the provenance: source file, ``averaged_from``, config, seed and
    framework version."""
    from nitro_core.handle import Nitro

    path = Path(path)
    refuse_existing(path, "Export path")
    if isinstance(nitro_or_source, Nitro):
        n = nitro_or_source
        state = n.model.state_dict()
        provenance = {
            "source_file": str(n.checkpoint_source) if n.checkpoint_source else None,
            "averaged_from": n.averaged_from,
            "experiment": type(n.experiment).__qualname__,
            "config": n.experiment.model_dump(mode="json"),
            "seed": n.seed,
            "run": n.run_id,
            "epoch": n.epoch,
            "step": n.step,
        }
    else:
        state, provenance = _from_source(nitro_or_source, run_dir)
    provenance.update(
        kind="weights", format_version=FORMAT_VERSION, framework_version=framework_version()
    )
    tensors = {k: to_host(v) for k, v in state.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    store.write_record(path, tensors, provenance)
    return path


def _from_source(
    source: Any, run_dir: str | Path | None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    from nitro_core.averaging import average
    from nitro_core.resolve import resolve
    from nitro_core.restore import read
    from nitro_core.sources import Average, Pair, PathSource, to_source

    src = to_source(source, "source")
    if run_dir is None:
        if not isinstance(src, PathSource):
            raise ConfigError(
                f"export_weights({str(src)!r}, ...) needs run_dir= to find the run; write "
                f"export_weights({str(src)!r}, path, run_dir='runs/MyExp')."
            )
        run_dir = Path(src.path).parent
    run_dir = Path(run_dir)
    resolved = resolve(src, run_dir, manifest.read_manifest(run_dir))
    if isinstance(src, Pair) and isinstance(src.pick, Average):
        result = average(resolved, run_dir)
        meta, state, averaged_from = result.meta, result.state, result.averaged_from
    else:
        record = read(resolved)
        meta, state = record.meta, record.model_state()
        averaged_from = meta.get("averaged_from")
    return state, {
        "source_file": str(resolved.path),
        "averaged_from": averaged_from,
        "experiment": meta.get("experiment"),
        "config": meta.get("config"),
        "seed": meta.get("seed"),
        "run": meta.get("run"),
        "epoch": meta.get("epoch"),
        "step": meta.get("step"),
    }
