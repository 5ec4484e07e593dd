"""How export_hf splits a state dict into shards and reads max_shard_size, in-process and
without writing a byte (nitro_core.store.hf): the plan is transformers' own, so a directory
Nitro writes has the shards transformers would write."""

from __future__ import annotations

import pytest
import torch

from nitro_core import ConfigError
from nitro_core.store.hf import parse_size, shard_plan


def _floats(*counts: int) -> dict[str, torch.Tensor]:
    return {f"t{i}": torch.zeros(n) for i, n in enumerate(counts)}  # 4 bytes an element


def test_a_shard_is_filled_to_exactly_its_size_before_the_next_starts():
    assert shard_plan(_floats(2, 2), 16) == [["t0", "t1"]]  # 8 + 8 bytes fill 16 exactly
    assert shard_plan(_floats(2, 2, 1), 16) == [["t0", "t1"], ["t2"]]
    assert shard_plan(_floats(2, 3), 16) == [["t0"], ["t1"]]  # 8 + 12 would overflow


@pytest.mark.parametrize(
    ("counts", "plan"),
    [((4,), [["t0"]]), ((4, 4), [["t0"], ["t1"]]), ((1, 4), [["t0"], ["t1"]]),
     ((4, 1), [["t0"], ["t1"]]), ((1, 4, 1), [["t0"], ["t1"], ["t2"]]), ((3, 1, 4), [["t0", "t1"], ["t2"]])],
)  # fmt: skip
def test_a_tensor_of_exactly_the_size_fills_one_shard_as_transformers_splits_it(counts, plan):
    """16 bytes under max_shard_size=16 fit (transformers moves only a tensor *larger* than
    the size to a shard of its own), and nothing joins a full shard."""
    hub = pytest.importorskip("huggingface_hub")
    assert shard_plan(_floats(*counts), 16) == plan
    split = hub.split_torch_state_dict_into_shards(_floats(*counts), max_shard_size=16)
    assert [list(keys) for keys in split.filename_to_tensors.values()] == plan


def test_a_tensor_larger_than_the_size_gets_a_shard_of_its_own():
    assert shard_plan(_floats(1, 10, 1), 16) == [["t0"], ["t1"], ["t2"]]
    assert shard_plan({}, 16) == [[]]


@pytest.mark.parametrize(
    "value, size",
    [("1KiB", 1024), ("3MiB", 3 * 2**20), ("2GiB", 2 * 2**30), ("1TiB", 2**40), ("2kb", 2000),
     (" 7 B ", 7), ("12", 12)],
)  # fmt: skip
def test_binary_and_decimal_units_are_told_apart(value, size):
    assert parse_size(value) == size


@pytest.mark.parametrize("value", ["0GB", "0", 0, -5, True, "-1GB", "1.5GB", "5 gigs"])
def test_a_size_that_is_not_a_positive_count_of_bytes_is_refused(value):
    with pytest.raises(ConfigError) as caught:
        parse_size(value)
    assert str(caught.value) == (
        f"max_shard_size={value!r} is not a size; write a positive number of bytes or a string "
        "such as '5GB', '500MB' or '2GiB'."
    )
