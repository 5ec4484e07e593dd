"""Two ranks write sharded records straight through :mod:`nitro_core.store.shards`, no
training: ``python -m torch.distributed.run --standalone --nproc_per_node 2
shard_script.py OUT``.

Writes ``OUT/sync`` (``shards.write``, DCP's ``save``) and ``OUT/async``
(``shards.write_async`` over a group of its own), each published by rank 0 with the digests
the ranks took, and ``OUT/full.safetensors``, the whole tensors (safetensors, no pickle).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from nitro_core.store import recordio as store
from nitro_core.store import shards


def full_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "params/w": torch.randn(7, 5, generator=g),  # 7 rows: uneven pieces
        "params/h": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "optim/state/0/exp_avg": torch.randn(6, 2, generator=g, dtype=torch.float64),
        "optim/state/0/step": torch.tensor(3.0),  # a plain tensor: written once
        "rng/torch": torch.arange(9, dtype=torch.uint8),
    }


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    main_rank = dist.get_rank() == 0
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    full = full_tensors()
    record = {
        k: v if v.dim() == 0 else distribute_tensor(v, mesh, [Shard(0)]) for k, v in full.items()
    }
    final = out / "sync"
    digests = shards.write(store.tmp_path(final), record, main_rank)
    if main_rank:
        shards.publish(store.tmp_path(final), final, {"step": 1}, digests)
    dist.barrier()
    group = dist.new_group(backend="gloo")
    final = out / "async"
    written = shards.write_async(store.tmp_path(final), record, main_rank, group)
    digests = written.result()
    if main_rank:
        shards.publish(store.tmp_path(final), final, {"step": 2}, digests)
        save_file(full, str(out / "full.safetensors"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
