"""A training script the distributed tests launch with ``torch.distributed.run``.

``python -m torch.distributed.run --standalone --nproc_per_node N rank_script.py RUN_DIR
EPOCHS RESUME STRATEGY [EVERY_STEPS] [STOP_AFTER_POINTS]``: trains ``DistRegression`` in
RUN_DIR and writes each rank's full parameters after training to
``RUN_DIR/final-<tag>-rank<r>.safetensors`` (safetensors, no pickle).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from nitro_core import Checkpointer, Last, Nitro
from nitro_core.examples import Regression

NAN_AT = os.environ.get("NITRO_TEST_NAN_AT")  # "RANK:BATCH": that rank's loss turns NaN there
_seen = [0]


class DistRegression(Regression):
    every_steps: int | None = None

    def checkpointer(self) -> Checkpointer:
        return Checkpointer(keep=Last(20), every_steps=self.every_steps)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = super().loss(model, batch)
        if NAN_AT and model.training:
            rank, at = map(int, NAN_AT.split(":"))
            _seen[0] += 1
            if int(os.environ["RANK"]) == rank and _seen[0] == at:
                out = out * float("nan")
        return out


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


def slow_shard_writes(seconds: float, run_dir: str) -> None:
    """Test hook: each rank, inside DCP's write of its shard (on the synchronous and the
    background path alike, so before any rank's files are durable), leaves a marker
    ``inside-write-rank<r>`` in ``run_dir`` and sleeps, so that a test can wait for the
    marker and kill a rank mid-write."""
    import time

    from nitro_core.store import shard_writer

    write_data = shard_writer.ShardWriter.write_data

    def slowed(self, plan, planner):
        rank = os.environ.get("RANK", "0")
        Path(run_dir, f"inside-write-rank{rank}").touch()
        time.sleep(seconds)
        return write_data(self, plan, planner)

    shard_writer.ShardWriter.write_data = slowed


def slow_shard_uploads(seconds: float, out: str) -> None:
    """Test hook (object storage): each rank, as it sends its shard, leaves a marker
    ``uploading-rank<r>-<n>`` in ``out`` and sleeps first, so that a test can wait for an
    upload and kill the ranks in the middle of a record's uploads."""
    import time

    from nitro_core.store import object_run

    upload, count = object_run.upload_shard, [0]

    def slowed(run, name, local):
        count[0] += 1
        Path(out, f"uploading-rank{os.environ.get('RANK', '0')}-{count[0]}").touch()
        time.sleep(seconds)
        return upload(run, name, local)

    object_run.upload_shard = slowed


def restore_and_dump(run_dir: str, source: str, strategy: str) -> None:
    """A new run taking ``source``'s weights and optimizer moments (restore_optimizer=True);
    each rank writes the whole optimizer state it then holds, keyed ``<param>/<slot>``, and
    its learning rate."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    exp = DistRegression(max_epochs=1, samples=520, batch_size=32, lr=0.005)
    n = Nitro(exp, run_dir=run_dir, weights=source, restore_optimizer=True, strategy=strategy)
    if n.dist.strategy == "fsdp":
        options = StateDictOptions(full_state_dict=True)
        state = get_optimizer_state_dict(n.model, n.optimizer, options=options)["state"]
    else:
        names = dict(enumerate(name for name, _ in n.model.named_parameters()))
        state = {names[i]: v for i, v in n.optimizer.state_dict()["state"].items()}
    flat = {
        f"{name}/{slot}": v.detach().clone().contiguous()
        for name, slots in state.items()
        for slot, v in slots.items()
        if isinstance(v, torch.Tensor)
    }
    lr = str(n.optimizer.param_groups[0]["lr"])
    params = full_parameters(n)
    save_file({**flat, **{f"params/{k}": v for k, v in params.items()}},
              os.path.join(run_dir, f"restored-rank{n.dist.rank}.safetensors"),
              metadata={"lr": lr})  # fmt: skip
    n.train()  # the moments step with the parameters they belong to
    save_file(full_parameters(n), os.path.join(run_dir, f"trained-rank{n.dist.rank}.safetensors"))
    n.close()


def fail_nth(module: object, name: str, at: int) -> None:
    """Test hook: the ``at``-th call of ``module.name`` on this rank fails (disk trouble)."""
    real, calls = getattr(module, name), [0]

    def failing(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            raise OSError(5, "Input/output error (injected)")
        return real(*args, **kwargs)

    setattr(module, name, failing)


def main() -> None:
    from nitro_core.store import recordio, shards

    if os.environ.get("NITRO_TEST_FAIL_PUBLISH"):  # FSDP: rank 0 publishes every record
        fail_nth(shards, "publish", int(os.environ["NITRO_TEST_FAIL_PUBLISH"]))
    if os.environ.get("NITRO_TEST_FAIL_WRITE"):  # DDP: rank 0 writes every record
        fail_nth(recordio, "write_record", int(os.environ["NITRO_TEST_FAIL_WRITE"]))
    if os.environ.get("NITRO_TEST_RESTORE_FROM"):
        os.makedirs(sys.argv[1], exist_ok=True)
        restore_and_dump(sys.argv[1], os.environ["NITRO_TEST_RESTORE_FROM"], sys.argv[4])
        return
    if os.environ.get("NITRO_TEST_SLOW_UPLOAD"):
        os.makedirs(os.environ["NITRO_TEST_OUT"], exist_ok=True)
        slow_shard_uploads(
            float(os.environ["NITRO_TEST_SLOW_UPLOAD"]), os.environ["NITRO_TEST_OUT"]
        )
    if os.environ.get("NITRO_TEST_SLOW_SHARD_WRITE"):
        slow_shard_writes(float(os.environ["NITRO_TEST_SLOW_SHARD_WRITE"]), sys.argv[1])
    run_dir, epochs, resume, strategy = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    every = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] != "-" else None
    stop_after = int(sys.argv[6]) if len(sys.argv) > 6 else None
    exp = DistRegression(max_epochs=epochs, every_steps=every, samples=520, batch_size=32)
    n = Nitro(
        exp, run_dir=run_dir, resume=False if resume == "false" else resume, strategy=strategy
    )
    rank = n.dist.rank
    loaded = full_parameters(n)
    points = []

    def on_point(row: dict) -> None:
        points.append(row)
        if stop_after is not None and len(points) >= stop_after:
            n.request_stop()

    n.train(on_epoch=on_point)
    tag = f"{epochs}-{resume.replace(' ', '')}-{strategy}-w{n.dist.world}"
    out = os.environ.get("NITRO_TEST_OUT", run_dir)  # a run directory on S3: a local one
    os.makedirs(out, exist_ok=True)
    save_file(loaded, os.path.join(out, f"loaded-{tag}-rank{rank}.safetensors"))
    save_file(full_parameters(n), os.path.join(out, f"final-{tag}-rank{rank}.safetensors"))
    n.close()


if __name__ == "__main__":
    main()
