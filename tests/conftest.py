"""Shared fixtures: every test runs in its own working directory, so default run
directories (runs/<Experiment>) land in tmp_path. Tests marked ``cuda`` are skipped on a
machine without a CUDA device."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run bench/gpu_check.sh on a CUDA machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
