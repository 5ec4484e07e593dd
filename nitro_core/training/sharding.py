"""The data splits under several processes: each rank trains on its share of the train
split, and evaluates its share of the others (their metric sums are then added up over the
ranks, so each row counts once).

- ``TensorBatches``: :meth:`~nitro_core.training.data.TensorBatches.shard` (padded for
  training, so every rank steps as often; unpadded for evaluation).
- A torch ``DataLoader`` (or torchdata's ``StatefulDataLoader``) over a map-style dataset:
  rebuilt, with its own settings, on a ``DistributedSampler`` (shuffled when the loader
  shuffled, seeded with the run's seed, its epoch set at each epoch's start), as Lightning
  does. A loader that already has a ``DistributedSampler`` is kept as it is.
- Anything else must shard itself: a split with a ``shard(rank, world)`` method is asked
  for its share; otherwise the handle refuses, naming what to return instead.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

from nitro_core.errors import ConfigError
from nitro_core.training.data import TensorBatches
from nitro_core.training.distributed import Dist

_LOADER_SETTINGS = (
    "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout", "worker_init_fn",
    "multiprocessing_context", "generator", "persistent_workers", "pin_memory_device",
)  # fmt: skip


def shard_splits(data: dict[str, Any], d: Dist, seed: int, name: str) -> dict[str, Any]:
    """Each split's share for this rank (the splits themselves in one process). Under FSDP
    only the train split is sharded: an FSDP forward pass is a collective, so every rank
    evaluates every batch of the others (and their sums are not added up)."""
    if d.world == 1:
        return data
    out = {}
    for split, value in data.items():
        train = split == "train"
        if not train and d.strategy == "fsdp":
            out[split] = value
        else:
            out[split] = _shard(value, d, seed, train, f"{name}.build_data()[{split!r}]")
    return out


def _shard(split: Any, d: Dist, seed: int, train: bool, where: str) -> Any:
    if isinstance(split, TensorBatches):
        return split.shard(d.rank, d.world, pad=train)
    if isinstance(split, DataLoader):
        return _shard_loader(split, d, seed, where)
    shard = getattr(split, "shard", None)
    if callable(shard):
        return shard(d.rank, d.world)
    raise ConfigError(
        f"{where} is a {type(split).__name__}, which Nitro cannot split across the "
        f"{d.world} ranks of this run (each rank would train on all of it). Return a "
        "nitro_core.TensorBatches, a torch DataLoader (or torchdata StatefulDataLoader) over a "
        "map-style dataset, or an object with a shard(rank, world) method that returns this "
        "rank's share."
    )


def _shard_loader(loader: DataLoader[Any], d: Dist, seed: int, where: str) -> Any:
    if isinstance(loader.sampler, DistributedSampler):
        return loader
    if isinstance(loader.dataset, IterableDataset):
        raise ConfigError(
            f"{where} is a DataLoader over an IterableDataset, which Nitro cannot split across "
            f"ranks; yield only this rank's items from the dataset (torch.distributed.get_rank() "
            "of get_world_size()) and give the loader a shard(rank, world) method returning "
            "itself, or use a map-style dataset."
        )
    if loader.batch_size is None:
        raise ConfigError(
            f"{where} is a DataLoader with a custom batch_sampler, which Nitro cannot split "
            "across ranks; build it on a torch.utils.data.DistributedSampler yourself."
        )
    sampler: DistributedSampler[Any] = DistributedSampler(
        loader.dataset,
        num_replicas=d.world,
        rank=d.rank,
        shuffle=isinstance(loader.sampler, RandomSampler),
        seed=seed,
        drop_last=loader.drop_last,
    )
    settings = {k: getattr(loader, k) for k in _LOADER_SETTINGS if hasattr(loader, k)}
    if loader.num_workers > 0:
        settings["prefetch_factor"] = loader.prefetch_factor
    return type(loader)(loader.dataset, batch_size=loader.batch_size, sampler=sampler, **settings)


def start_epoch(split: Any, epoch: int) -> None:
    """Tell a ``DistributedSampler`` which epoch begins (its order depends on it)."""
    sampler = getattr(split, "sampler", None)
    if isinstance(sampler, DistributedSampler):
        sampler.set_epoch(epoch)
