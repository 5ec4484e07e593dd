"""Seeding and capturing every random-number generator a training step can draw from:
Python's ``random``, NumPy's global generator, torch's CPU generator and each CUDA device's.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device, lazily


RngState = tuple[dict[str, Any], dict[str, torch.Tensor]]  # (JSON part, tensor part)


def capture() -> RngState:
    """(JSON state of Python and NumPy, tensors of torch's generators)."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=True)  # the default, spelled out for the type checker
    assert isinstance(np_state, tuple)  # the legacy generator (MT19937) gives the tuple form
    kind, keys, pos, has_gauss, cached = np_state
    json_state = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
    }
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda/{i}"] = state
    return json_state, tensors


def restore(json_state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Put every generator back where :func:`capture` found it."""
    version, internal, gauss = json_state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = json_state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(tensors["torch"])
    cuda = sorted((int(k.split("/")[1]), v) for k, v in tensors.items() if k.startswith("cuda/"))
    if cuda and torch.cuda.is_available():
        for i, state in cuda[: torch.cuda.device_count()]:
            torch.cuda.set_rng_state(state, i)


@contextmanager
def isolated() -> Iterator[None]:
    """Run the block without moving any generator: evaluation draws nothing from the
    training trajectory."""
    json_state, tensors = capture()
    try:
        yield
    finally:
        restore(json_state, tensors)
