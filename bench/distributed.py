"""Sharded records across ranks: save and load time of Nitro's record directory against
torch.distributed.checkpoint's own ``dcp.save``/``dcp.load`` (its default FileSystemWriter:
``.distcp`` files and a pickled ``.metadata``) and against rank 0 gathering the full state and
writing one safetensors file.

The state is an FSDP2 (``fully_shard``) stack of bias-free ``d x d`` linear layers with an
AdamW optimizer whose moments exist (one step taken), about ``--mb`` MB in all (parameters
plus two moments). Each method runs ``--reps`` times, interleaved, and the medians are
printed with the ratio against DCP's default writer (target: Nitro within 1.2x).

- nitro save: ``nitro_core.store.shards.write`` (``dcp.save`` through Nitro's
  ``ShardWriter``, :mod:`nitro_core.store.shard_writer`: every rank writes its own
  safetensors shard on ``HuggingFaceStorageWriter``'s layout straight from its tensors, and
  hashes it while ``fsync`` puts it on the disk; DCP gathers the digests to rank 0) plus rank
  0's ``publish`` (``header.json`` naming those digests, rename, directory fsyncs; no shard
  is read back): what a checkpoint point costs.
- nitro load: what a resume under FSDP does (``fsdp_state.read_pieces``): the digests
  checked, then DCP loads only this rank's pieces straight into the live parameters and
  optimizer moments, and the optimizer takes its non-tensor state.
- dcp save / load: ``dcp.save(state, checkpoint_id=dir)`` and ``dcp.load`` into the
  sharded state dict.
- dcp hf save: ``dcp.save`` through torch's ``HuggingFaceStorageWriter`` (the same files,
  without digests), which first serializes each rank's whole shard into one ``bytes``
  object (``safetensors.torch.save``): the writer Nitro used before its own.
- gather+file: rank 0 gathers the full state (``full_state_dict=True, cpu_offload=True``)
  and writes one safetensors file with fsync (the one-file alternative).

On this 2-core CPU machine the two ranks share the cores with the writer threads; figures
move from run to run. Run from the repository root (it launches itself through
torch.distributed.run):  python bench/distributed.py [--mb 1024] [--reps 3]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TARGET = 1.2


def launch(argv: list[str]) -> int:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        __file__, "--rank-process", *argv,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, env=env, check=False).returncode


def main() -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.fsdp import fully_shard

    from nitro_core.state import records
    from nitro_core.store import shards
    from nitro_core.training import fsdp_state
    from nitro_core.training.distributed import Dist
    from nitro_core.training.sharded_save import live_leaf

    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=float, default=1024)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rank-process", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ranks = Dist(rank=rank, world=dist.get_world_size(), strategy="fsdp")
    # parameters + two AdamW moments = 3 x layers x d^2 x 4 bytes
    d = 1024
    layers = max(1, math.ceil(args.mb * 2**20 / (3 * d * d * 4)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, d)).sum().backward()
    opt.step()
    total = 3 * layers * d * d * 4
    root = Path(tempfile.mkdtemp(prefix="nitro-dist-bench-")) if rank == 0 else None
    root = Path(_broadcast(str(root) if root else None))

    def record() -> tuple[dict[str, Any], dict[str, Any]]:
        snap = records.Snapshot(header={"step": 1}, model=model, optimizer=opt)
        return records.encode(snap, leaf=live_leaf)

    def nitro_save(i: int) -> None:
        tensors, meta = record()
        tmp, final = root / f"nitro-{i}.tmp", root / f"nitro-{i}"
        digests = shards.write(tmp, tensors, rank == 0)
        if rank == 0:
            shards.publish(tmp, final, meta, digests)
        dist.barrier()

    def nitro_load(i: int) -> None:
        # what a resume under FSDP does: this rank's pieces, straight into the live tensors
        rec = fsdp_state.read_pieces(model, opt, None, root / f"nitro-{i}", None, ranks)
        opt.load_state_dict(rec.tree("optimizer"))
        dist.barrier()

    def hf_save(i: int) -> None:
        from torch.distributed.checkpoint import HuggingFaceStorageWriter

        msd, osd = get_state_dict(model, opt)
        flat = {f"params/{k}": v for k, v in msd.items()}
        for name, state in osd["state"].items():
            for key, value in state.items():
                flat[f"optim/{name}/{key}"] = value
        writer = HuggingFaceStorageWriter(str(root / f"hf-{i}"), save_distributed=True)
        dcp.save(flat, storage_writer=writer)
        dist.barrier()

    def dcp_save(i: int) -> None:
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(root / f"dcp-{i}"))
        dist.barrier()

    def dcp_load(i: int) -> None:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=str(root / f"dcp-{i}"))
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"])
        dist.barrier()

    def gather_file(i: int) -> None:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        msd, osd = get_state_dict(model, opt, options=options)
        if rank == 0:
            flat = {f"params/{k}": v for k, v in msd.items()}
            for name, state in osd["state"].items():
                for key, value in state.items():
                    flat[f"optim/{name}/{key}"] = value
            with open(root / f"one-{i}.safetensors", "wb") as f:
                f.write(save(flat))
                f.flush()
                os.fsync(f.fileno())
        dist.barrier()

    methods = {
        "nitro save": nitro_save, "dcp save": dcp_save, "dcp hf save": hf_save,
        "gather+file save": gather_file,
        "nitro load": nitro_load, "dcp load": dcp_load,
    }  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in methods}
    for i in range(args.reps):
        for name, run in methods.items():
            dist.barrier()
            t0 = time.perf_counter()
            run(i)
            times[name].append(time.perf_counter() - t0)
    if rank == 0:
        med = {name: statistics.median(v) for name, v in times.items()}
        gib = total / 2**30
        print(f"state: {gib:.2f} GiB over 2 ranks (FSDP2, AdamW); {args.reps} reps, medians")
        for name, seconds in med.items():
            base = med["dcp save"] if "save" in name else med["dcp load"]
            print(
                f"  {name:18s} {seconds:7.3f} s  {gib / seconds:6.2f} GiB/s  {seconds / base:5.2f}x dcp"
            )
        for kind in ("save", "load"):
            ratio = med[f"nitro {kind}"] / med[f"dcp {kind}"]
            verdict = "meets" if ratio <= TARGET else "misses"
            print(f"nitro {kind} / dcp {kind}: {ratio:.2f}x ({verdict} the {TARGET}x target)")
        shutil.rmtree(root, ignore_errors=True)
    dist.destroy_process_group()


def _broadcast(value: Any) -> Any:
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


if __name__ == "__main__":
    if "--rank-process" in sys.argv:
        main()
    else:
        sys.exit(launch(sys.argv[1:]))
