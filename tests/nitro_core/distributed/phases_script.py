"""The fast suite's several-process script: one ``torch.distributed.run`` launch runs
several handles in turn, under DDP and then FSDP, so that the default suite pays torchrun's
start (and every rank's first optimizer, which imports dynamo) once.

``python -m torch.distributed.run --standalone --nproc_per_node 2 phases_script.py OUT``:
the script makes the process group itself (the handles join it); for each strategy S it

- ``S/a``: trains ``Jittered`` uninterrupted (2 epochs, a point every 2 steps);
- ``S/b``: the same, and rank 1 alone asks for a stop at its third point (the end of epoch
  1), so the ranks must agree that one of them asked: every rank stops at the next point,
  epoch 2 batch 1 (a mid-epoch record), and reads the manifest as ``train()`` returns;
- ``S/b`` again (``c``): resumes ``b`` (``resume="auto"``) to the end.

Then, for each strategy, ``S/d``: a run whose second checkpoint write fails on rank 0 (in
the background; DDP's record write, FSDP's publish): every rank must stop at the next
point, the others with rank 0's words. These come last: a rank left behind there would
leave the group out of step.

Each rank writes ``OUT/rank<r>.json`` (after every phase, so a hang leaves what was done)
and ``OUT/<S>-<a|c>-rank<r>.safetensors`` (its full parameters after ``a`` and ``c``).
``Jittered`` draws a different number of random values on each rank, so the ranks'
generators, data orders and running loss sums all differ: a rank resumed with another
rank's state shows.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from nitro_core import Checkpointer, Last, Nitro, read_manifest
from nitro_core.examples import Regression

STRATEGIES = ("ddp", "fsdp")


class Jittered(Regression):
    """Regression with input jitter; rank r draws r extra values a step first."""

    every_steps: int | None = 2

    def checkpointer(self) -> Checkpointer:
        return Checkpointer(keep=Last(20), every_steps=self.every_steps)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = batch["x"]
        if model.training:
            torch.rand(dist.get_rank())  # the ranks' generators part ways here
            x = x + 0.01 * torch.randn_like(x)
        return torch.nn.functional.mse_loss(model(x), batch["y"])


def experiment(epochs: int = 2) -> Jittered:
    # 150 train rows, 75 a rank, batches of 16: 5 batches an epoch; points after steps
    # 2, 4 (epoch 1 batches 2 and 4), 5 (its end), 6, 8 (epoch 2 batches 1 and 3), 10
    return Jittered(max_epochs=epochs, samples=200, batch_size=16)


def full_parameters(n: Nitro) -> dict[str, torch.Tensor]:
    if n.dist.strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        state = get_model_state_dict(n.model, options=StateDictOptions(full_state_dict=True))
    else:
        state = n.model.state_dict()
    return {k: v.detach().clone().contiguous() for k, v in state.items()}


@contextmanager
def second_call_fails(module: object, name: str, here: bool) -> Iterator[None]:
    """On this rank (``here``), the second call of ``module.name`` fails (disk trouble)."""
    real, calls = getattr(module, name), [0]

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            raise OSError(5, "Input/output error (injected)")
        return real(*args, **kwargs)

    if here:
        setattr(module, name, failing)
    try:
        yield
    finally:
        setattr(module, name, real)


def resume_phases(out: Path, strategy: str, rank: int) -> dict[str, Any]:
    said: dict[str, Any] = {}
    a = Nitro(experiment(), run_dir=out / "a", strategy=strategy).train()
    save_file(full_parameters(a), str(out / f"a-rank{rank}.safetensors"))
    said["a"] = a.history

    b = Nitro(experiment(), run_dir=out / "b", strategy=strategy)
    points: list[dict[str, Any]] = []

    def on_point(row: dict[str, Any]) -> None:
        points.append(row)
        if rank == 1 and len(points) == 3:  # rank 1 alone, at the end of epoch 1
            b.request_stop()

    b.train(on_epoch=on_point)
    last = read_manifest(out / "b")[-1]  # as train() returns: rank 0 committed its last record
    said["b"] = {
        "at": [b.epoch, b.batch, b.step],
        "stop": b.stop_reason,
        "listed": [last.epoch, last.batch, last.step],
    }

    c = Nitro(experiment(), run_dir=out / "b", resume="auto", strategy=strategy).train()
    save_file(full_parameters(c), str(out / f"c-rank{rank}.safetensors"))
    said["c"] = c.history
    return said


def failing_write(out: Path, strategy: str, rank: int) -> str | None:
    from nitro_core.store import recordio, shards

    # rank 0 alone writes (DDP's record) or publishes (FSDP's) every record
    module, name = (shards, "publish") if strategy == "fsdp" else (recordio, "write_record")
    with second_call_fails(module, name, here=rank == 0):
        try:  # points after steps 2 (written), 4 (its write fails) and 5 (the epoch's end)
            Nitro(experiment(epochs=1), run_dir=out / "d", strategy=strategy).train()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
    return None


def main() -> None:
    out = Path(sys.argv[1])
    # a rank out of step fails in a bounded time (generous: a loaded 2-core machine)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    said: dict[str, Any] = {}
    report = out / f"rank{rank}.json"
    for strategy in STRATEGIES:
        (out / strategy).mkdir(parents=True, exist_ok=True)
        said[strategy] = resume_phases(out / strategy, strategy, rank)
        report.write_text(json.dumps(said))
    for strategy in STRATEGIES:
        said[strategy]["d"] = failing_write(out / strategy, strategy, rank)
        report.write_text(json.dumps(said))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
