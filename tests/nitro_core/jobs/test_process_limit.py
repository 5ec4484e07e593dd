"""How many processes a launch may start (issue 19 item 12): one per visible GPU when the
ranks train on CUDA, else one per CPU this process may run on. The gate's refusal of a
larger ``nproc`` (tests/nitro_mcp/test_gate_leniencies.py) takes its limit from this rule,
so the rule itself is checked here against machines of known size."""

from __future__ import annotations

import os

import pytest
import torch

from nitro_core.jobs.rank_launch import process_limit


def test_on_cpu_the_limit_is_the_cpus_this_process_may_run_on(monkeypatch):
    real = len(os.sched_getaffinity(0))
    assert process_limit("cpu")[0] == real  # nproc=64 on a 2-core machine is refused
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5})
    assert process_limit("cpu") == (3, "3 CPUs this process may use, and no GPU")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1})
    assert process_limit("cpu") == (1, "1 CPU this process may use, and no GPU")


@pytest.mark.parametrize(
    ("device", "cuda", "gpus", "expected"),
    [
        ("auto", False, 0, (3, "3 CPUs this process may use, and no GPU")),
        ("auto", True, 2, (2, "2 visible GPUs (one process per GPU)")),
        ("cuda", True, 1, (1, "1 visible GPU (one process per GPU)")),
        ("cuda:1", True, 4, (4, "4 visible GPUs (one process per GPU)")),
        ("cpu", True, 8, (3, "3 CPUs this process may use, and no GPU")),
    ],
)
def test_on_cuda_the_limit_is_the_visible_gpus(monkeypatch, device, cuda, gpus, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert process_limit(device) == expected
