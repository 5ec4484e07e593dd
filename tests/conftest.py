"""Shared fixtures: every test runs in its own working directory, so default run
directories (runs/<Experiment>) land in tmp_path. Tests marked ``cuda`` are skipped on a
machine without a CUDA device. Every process a test starts dumps each thread's Python
stack to its stderr if it crashes (``PYTHONFAULTHANDLER``), so that a failure's output says
where."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("PYTHONFAULTHANDLER", "1")


@pytest.fixture(scope="session")
def s3_endpoint():
    """A SeaweedFS server (tests/s3_server.py) for every test that needs object storage,
    started once, on first use, and stopped by its pid at the end of the session."""
    from tests.s3_server import seaweedfs

    with seaweedfs() as url:
        yield url


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
