"""The process group a handle trains in: one process, or the ranks ``torchrun`` started.

A script that builds ``Nitro(...)`` runs unchanged under ``torchrun --nproc_per_node N``:
:func:`join` reads torchrun's environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``),
initializes the default process group (gloo on CPU, nccl on CUDA) unless the script did,
gives each rank its device (``cuda:LOCAL_RANK``) and remembers whether the handle owns the
group (then :meth:`Dist.close` destroys it). Everything else the handle needs of the group
goes through :class:`Dist`: agreeing on a stop, reducing metric sums, gathering each
rank's generator and data state to rank 0, broadcasting rank 0's choices.

The object collectives (``all_gather_object``, ``broadcast_object_list``) serialize small
Python values in memory between the ranks of one job; nothing they carry is written to or
read from disk.
"""

from __future__ import annotations

import atexit
import gc
import os
import time
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

from nitro_core.errors import ConfigError

Strategy = Literal["none", "ddp", "fsdp"]
STRATEGIES = ("auto", "ddp", "fsdp")


@dataclass
class Dist:
    """One rank's view of the group (``world == 1``: a single process, every collective a
    no-op)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    strategy: Strategy = "none"
    owned: bool = False  # this handle initialized the group and destroys it
    checkpoint_group: Any = None  # FSDP: a gloo group for background checkpoint writes

    @property
    def main(self) -> bool:
        """Whether this rank writes records, the manifest and the logs (rank 0)."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        """Whether there is a group to talk to (more than one rank)."""
        return self.world > 1 and dist.is_available() and dist.is_initialized()

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (every rank gets the same answer)."""
        if not self.active:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=self._device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def mean(self, value: float) -> float:
        """The mean of ``value`` over the ranks (summed in rank order: the same everywhere)."""
        if not self.active:
            return value
        values = self.gather(value)
        return float(sum(values) / len(values))

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.active:
            return obj
        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def reduce_totals(
        self, totals: dict[str, tuple[float, float]]
    ) -> dict[str, tuple[float, float]]:
        """Metric (sum, count) pairs summed over the ranks, in rank order, so that every rank
        finalizes the same metrics and decides the same stops."""
        if not self.active:
            return totals
        merged: dict[str, list[float]] = {}
        for part in self.gather(totals):
            for name, (s, c) in sorted(part.items()):
                acc = merged.setdefault(name, [0.0, 0.0])
                acc[0] += s
                acc[1] += c
        return {name: (s, c) for name, (s, c) in sorted(merged.items())}

    def close(self) -> None:
        """Destroy the group when this handle created it, once every rank got here (a rank
        that tore its connections down while another still talked over them would make
        that one abort)."""
        if self.owned and dist.is_available() and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
        self.owned = False

    def _device(self) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def describe(self) -> str:
        return f"rank {self.rank} of {self.world} ({self.strategy})"


def environment_world() -> tuple[int, int, int]:
    """(world size, rank, local rank) from torchrun's environment; (1, 0, 0) without it."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError as e:
        raise ConfigError(
            f"torchrun's environment is not numeric ({e}); launch with torchrun "
            "--nproc_per_node N script.py, which sets WORLD_SIZE, RANK and LOCAL_RANK."
        ) from None
    return world, rank, local


def check_strategy(strategy: Any) -> str:
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"strategy={strategy!r} is not a strategy; write 'auto' (DDP when torchrun starts "
            "more than one process), 'ddp' or 'fsdp'."
        )
    return str(strategy)


def join(strategy: str, device: torch.device, requested: bool) -> tuple[Dist, torch.device]:
    """This process's place in the group, and its device. ``requested``: the device was
    named by the caller (``device="cuda:1"``), not chosen (``"auto"``)."""
    check_strategy(strategy)
    if dist.is_available() and dist.is_initialized():  # the script made the group itself
        world, rank, owned = dist.get_world_size(), dist.get_rank(), False
        local = environment_world()[2]
    else:
        world, rank, local = environment_world()
        # FSDP under `torchrun --nproc_per_node 1` still shards over a group of one
        owned = world > 1 or (strategy == "fsdp" and "RANK" in os.environ)
    if owned:
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(local)
        dist.init_process_group(backend=backend)
    if dist.is_available() and dist.is_initialized():  # a script's own group too: its DDP
        atexit.unregister(_destroy_at_exit)  # or FSDP modules hold gloo's threads as well
        atexit.register(_destroy_at_exit)  # once, however many handles join
    if device.type == "cuda" and world > 1 and not requested:
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    kind: Strategy
    if strategy == "fsdp":
        kind = "fsdp"
    elif strategy == "ddp" or world > 1:
        kind = "ddp" if world > 1 else "none"
    else:
        kind = "none"
    d = Dist(rank=rank, world=world, local_rank=local, strategy=kind, owned=owned)
    if kind == "fsdp" and dist.is_initialized():  # every rank creates it, in the same order
        d.checkpoint_group = dist.new_group(backend="gloo")
    return d, device


def _destroy_at_exit() -> None:
    """At interpreter exit, while Python is still whole: destroy the group (unless
    :meth:`Dist.close` did), collect the cycles that keep its objects alive, and wait until
    gloo's threads are idle.

    ``destroy_process_group`` forgets a group, but a module that holds it (DDP, an FSDP
    mesh) keeps its C++ object and the worker threads alive into finalization. A worker that
    still releases a collective's tensors then takes the GIL, and a thread that takes the
    GIL while Python finalizes is ended with ``pthread_exit``, which inside C++ aborts the
    whole process ("terminate called without an active exception", SIGABRT after the run
    finished; pytorch/pytorch#179291 describes the same for a group never destroyed).
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()  # a group held only by cycles is destroyed now, joining its threads
    wait_threads_idle(GLOO_THREADS, limit=5.0)


GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")  # the names gloo gives its threads


def wait_threads_idle(names: tuple[str, ...], limit: float) -> bool:
    """Wait (at most ``limit`` seconds) until every thread of this process named one of
    ``names`` sleeps and has not run since the last look, the GIL released in between so
    that a thread waiting for it gets it; whether they all were idle. Linux reads
    ``/proc/self/task``; elsewhere there is nothing to read and this returns at once."""
    deadline = time.monotonic() + limit
    before = _thread_states(names)
    while before:
        time.sleep(0.002)
        now = _thread_states(names)
        if now == before and all(state == "S" for state, _ in now.values()):
            return True
        if time.monotonic() > deadline:
            return False
        before = now
    return True


def _thread_states(names: tuple[str, ...]) -> dict[str, tuple[str, int]]:
    """Each named thread's scheduler state and its context switches so far, by thread id."""
    out: dict[str, tuple[str, int]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:  # ended in the meantime
            continue
        if fields.get("Name", "").strip() not in names:
            continue
        switches = sum(
            int(fields.get(k, "0"))
            for k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")
        )
        out[tid] = (fields.get("State", "?").strip()[:1], switches)
    return out


def wrap(model: torch.nn.Module, forward: torch.nn.Module, d: Dist) -> torch.nn.Module:
    """The module training's forward passes run through: ``forward`` wrapped in DDP (which
    averages gradients across ranks) when the strategy is DDP, else ``forward`` itself (an
    FSDP2 module shards itself; see :func:`shard_model`)."""
    if d.strategy != "ddp" or not d.active:
        return forward
    from torch.nn.parallel import DistributedDataParallel

    device = next(model.parameters(), torch.empty(0)).device
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(forward, device_ids=ids)


def shard_model(model: torch.nn.Module, d: Dist) -> torch.nn.Module:
    """FSDP2: ``fully_shard`` each direct child that holds parameters, then the root (the
    usual wrap; parameters become DTensors sharded along dim 0 across the ranks)."""
    if d.strategy != "fsdp":
        return model
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized():
        raise ConfigError(
            "strategy='fsdp' needs a process group: launch with torchrun --nproc_per_node N "
            "(or `nitro train EXP --nproc N`), or use strategy='auto' in one process."
        )
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child)
    fully_shard(model)
    return model
