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


S3_SERVERS = ("seaweedfs", "moto")  # tests/s3_server.py: each S3 test runs against both


@pytest.fixture(scope="session", params=S3_SERVERS)
def s3_endpoint(request):
    """A real S3 server (tests/s3_server.py) for every test that needs object storage: each
    such test runs on SeaweedFS and on moto's server (the kill loops and torchrun runs on
    SeaweedFS alone: see ``pytest_collection_modifyitems``). Each server is started once, on first use, and
    stopped by its pid when its tests are done."""
    from tests import s3_server

    with getattr(s3_server, request.param)() as url:
        yield url


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    # the S3 kill loops and torchrun runs are slow and run on SeaweedFS only: on moto too
    # they would double the slow suite's S3 time; every other S3 test runs on both servers
    moto = [item for item in items if _s3_server(item) == "moto" and _seaweedfs_only(item)]
    if moto:
        config.hook.pytest_deselected(items=moto)
        items[:] = [item for item in items if item not in moto]
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run bench/gpu_check.sh on a CUDA machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def _s3_server(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("s3_endpoint") if callspec is not None else None


SEAWEEDFS_ONLY = ("killing", "ddp", "fsdp")  # kill loops, and runs through torchrun


def _seaweedfs_only(item: pytest.Item) -> bool:
    return "slow" in item.keywords and any(word in item.name for word in SEAWEEDFS_ONLY)
