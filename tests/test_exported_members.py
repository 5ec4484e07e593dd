"""Each package re-exports its public names with a sorted ``__all__``."""

from __future__ import annotations

import pytest

import nitro_core
import nitro_mcp


@pytest.mark.parametrize("package", [nitro_core, nitro_mcp])
def test_all_is_sorted_and_every_name_exists(package):
    names = package.__all__
    assert names == sorted(names)
    for name in names:
        assert hasattr(package, name), name


def test_design_contract_names_are_exported():
    contract = {
        "Experiment", "Host", "Nitro", "Checkpointer", "Best", "Last", "Every", "Epochs",
        "TopKCheckpointer", "EMA", "EarlyStopping", "Plateau", "read_manifest", "checkpoint_info",
        "runs", "checkpoint_run", "NitroError", "CheckpointCorrupt",
    }  # fmt: skip
    assert contract <= set(nitro_core.__all__)


def test_public_names_have_no_leading_underscore():
    assert not [n for n in nitro_core.__all__ if n.startswith("_") and n != "__version__"]
