"""Shared fixtures: every test runs in its own working directory, so default run
directories (runs/<Experiment>) land in tmp_path."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
