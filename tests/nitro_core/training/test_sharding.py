"""The data and records of several processes, checked in one process: each rank's share of
a split, a position carried to another world size, per-rank state in a record, and the
refusals that name what to write instead."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from nitro_core import TensorBatches
from nitro_core.errors import ConfigError
from nitro_core.state import ranks, records
from nitro_core.training import distributed, sharding
from nitro_core.training.distributed import Dist


def rows(split: TensorBatches) -> list[int]:
    return [int(v) for batch in split for v in batch["i"]]


def test_training_shards_cover_every_row_and_yield_as_many_batches_on_every_rank() -> None:
    data = TensorBatches({"i": torch.arange(10)}, 2, shuffle=True)
    torch.manual_seed(0)
    shares = []
    for rank in range(3):
        torch.manual_seed(0)  # every rank draws the same order
        shares.append(rows(data.shard(rank, 3)))
    assert [len(s) for s in shares] == [4, 4, 4]  # 10 rows padded to 12
    assert len(data.shard(2, 3)) == 2
    assert set().union(*shares) == set(range(10))
    # evaluation shares are unpadded: each row counts once
    ev = [rows(TensorBatches({"i": torch.arange(10)}, 2).shard(r, 3, pad=False)) for r in range(3)]
    assert sorted(sum(ev, [])) == list(range(10))


def test_after_k_batches_the_ranks_consumed_the_orders_first_rows() -> None:
    data = TensorBatches({"i": torch.arange(24)}, 2, shuffle=True)
    torch.manual_seed(5)
    order = torch.randperm(24).tolist()
    consumed = []
    for rank in range(2):
        torch.manual_seed(5)
        it = iter(data.shard(rank, 2))
        for _ in range(3):
            consumed += [int(v) for v in next(it)["i"]]
    assert sorted(consumed) == sorted(order[: 3 * 2 * 2])


def test_a_position_carries_over_to_another_world_size() -> None:
    two = TensorBatches({"i": torch.arange(24)}, 2, shuffle=True).shard(0, 2)
    torch.manual_seed(1)
    it = iter(two)
    for _ in range(3):
        next(it)
    state = two.state_dict()
    assert state["world"] == 2 and state["yielded"] == 3
    one = TensorBatches({"i": torch.arange(24)}, 2, shuffle=True)
    one.load_state_dict(state)
    rest = rows(one)
    torch.manual_seed(1)
    order = torch.randperm(24).tolist()
    assert rest == order[12:]  # 3 batches x 2 rows x 2 ranks consumed


def test_a_loader_is_rebuilt_on_a_distributed_sampler_with_its_settings() -> None:
    loader = DataLoader(TensorDataset(torch.arange(10)), batch_size=3, shuffle=True, drop_last=True)
    d = Dist(rank=1, world=2, strategy="ddp")
    shared = sharding.shard_splits({"train": loader}, d, seed=7, name="Exp")["train"]
    assert isinstance(shared.sampler, DistributedSampler)
    assert (shared.sampler.rank, shared.sampler.num_replicas, shared.sampler.seed) == (1, 2, 7)
    assert shared.sampler.shuffle and shared.batch_size == 3 and shared.drop_last
    sharding.start_epoch(shared, 4)
    assert shared.sampler.epoch == 4


def test_a_split_nitro_cannot_shard_is_refused_with_what_to_return() -> None:
    d = Dist(rank=0, world=2, strategy="ddp")
    with pytest.raises(ConfigError) as e:
        sharding.shard_splits({"train": [1, 2, 3]}, d, seed=0, name="Exp")
    assert str(e.value) == (
        "Exp.build_data()['train'] is a list, which Nitro cannot split across the 2 ranks of "
        "this run (each rank would train on all of it). Return a nitro_core.TensorBatches, a "
        "torch DataLoader (or torchdata StatefulDataLoader) over a map-style dataset, or an "
        "object with a shard(rank, world) method that returns this rank's share."
    )


def test_fsdp_shards_only_the_train_split() -> None:
    d = Dist(rank=0, world=2, strategy="fsdp")
    val = TensorBatches({"i": torch.arange(10)}, 2)
    out = sharding.shard_splits({"train": val, "val": val}, d, seed=0, name="Exp")
    assert out["val"] is val and out["train"].world == 2


def test_an_unknown_strategy_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError) as e:
        distributed.join("ddp2", torch.device("cpu"), requested=False)
    assert str(e.value) == (
        "strategy='ddp2' is not a strategy; write 'auto' (DDP when torchrun starts more than "
        "one process), 'ddp' or 'fsdp'."
    )


def test_one_process_joins_no_group_and_every_collective_is_local() -> None:
    d, device = distributed.join("auto", torch.device("cpu"), requested=False)
    assert (d.world, d.rank, d.strategy, d.owned, d.active) == (1, 0, "none", False, False)
    assert device == torch.device("cpu")
    assert d.any(True) and not d.any(False)
    assert d.mean(2.5) == 2.5 and d.broadcast("x") == "x"
    assert d.reduce_totals({"loss": (1.0, 2.0)}) == {"loss": (1.0, 2.0)}


def test_fsdp_in_one_plain_process_is_refused_naming_torchrun() -> None:
    from nitro_core import Nitro
    from nitro_core.examples import Regression

    with pytest.raises(ConfigError) as e:
        Nitro(Regression(), run_dir="unused", strategy="fsdp")
    assert "strategy='fsdp' needs a process group: launch with torchrun" in str(e.value)


def test_a_record_holds_every_ranks_state_and_each_rank_resumes_its_own() -> None:
    header: dict = {"rng": {"python": 0}, "position": {"batch": 3, "epoch_rng": {"p": 0}}}
    tensors = {"rng/torch": torch.tensor([0]), "rng/epoch/torch": torch.tensor([10])}
    states = [
        ranks.RankState(rng={"python": r}, rng_tensors={"torch": torch.tensor([r])},
                        epoch_rng=({"p": r}, {"torch": torch.tensor([10 + r])}),
                        data={"yielded": 3, "order_rng": torch.tensor([20 + r])})
        for r in range(3)
    ]  # fmt: skip
    ranks.attach(header, tensors, states)
    rec = records.Record(meta={**header, "data": {"yielded": 3}}, tensors=tensors)
    assert ranks.recorded_world(rec.meta) == 3
    assert ranks.view(rec, 0) is rec
    two = ranks.view(rec, 2)
    assert two.meta["rng"] == {"python": 2} and two.meta["position"]["epoch_rng"] == {"p": 2}
    assert int(two.rng_tensors()["torch"]) == 2
    assert int(two.rng_tensors("rng/epoch/")["torch"]) == 12
    assert int(two.tree("data")["order_rng"]) == 22
    # a rank the record has no state for takes rank % world's
    assert ranks.view(rec, 4).meta["rng"] == {"python": 1}


def test_a_path_ending_in_a_slash_names_a_record_directory(tmp_path) -> None:
    from nitro_core.errors import CheckpointNotFound
    from nitro_core.sources.grammar import PathSource, to_source
    from nitro_core.sources.resolve import resolve

    assert to_source("runs/x/epoch-0003-step-36/") == PathSource("runs/x/epoch-0003-step-36/")
    with pytest.raises(CheckpointNotFound) as e:
        resolve(to_source("epoch-0003-step-36/"), tmp_path, [])
    assert str(e.value).startswith("Record directory 'epoch-0003-step-36/' not found (looked at ")
    assert "a sharded record is a directory holding header.json" in str(e.value)


class _TwoRanks(Dist):
    """A rank of two whose peer's values are given (the gather a real group would do)."""

    def __init__(self, peer: object) -> None:
        super().__init__(rank=0, world=2, strategy="ddp")
        self.peer = peer

    @property
    def active(self) -> bool:
        return True

    def gather(self, obj: object) -> list[object]:
        return [obj, self.peer]


def test_metric_sums_and_counts_are_added_over_the_ranks_before_finalizing() -> None:
    d = _TwoRanks({"acc": (3.0, 4.0), "loss": (2.0, 4.0)})
    merged = d.reduce_totals({"loss": (1.0, 2.0), "acc": (1.0, 2.0)})
    assert merged == {"acc": (4.0, 6.0), "loss": (3.0, 6.0)}
    assert _TwoRanks(3.0).mean(1.0) == 2.0  # the training loss row: the ranks' mean


def test_a_stateful_loader_is_rebuilt_as_a_stateful_loader() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(TensorDataset(torch.arange(8)), batch_size=2, shuffle=False)
    shared = sharding.shard_splits(
        {"train": loader}, Dist(rank=0, world=2, strategy="ddp"), seed=3, name="Exp"
    )["train"]
    assert isinstance(shared, StatefulDataLoader)
    assert [int(v) for b in shared for v in b[0]] == [0, 2, 4, 6]
    # it keeps its per-rank position: a second loader continues after the first batch
    it = iter(shared)
    next(it)
    state = shared.state_dict()
    again = sharding.shard_splits(
        {"train": loader}, Dist(rank=0, world=2, strategy="ddp"), seed=3, name="Exp"
    )["train"]
    again.load_state_dict(state)
    assert [int(v) for b in again for v in b[0]] == [4, 6]
