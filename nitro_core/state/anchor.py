"""Decoupled weight decay toward the initial weights (``decay_anchor() == "w0"``).

The optimizer's own ``weight_decay`` is taken over (set to 0 in its groups) and applied
after each step as ``p -= lr * weight_decay * (p - w0)``. ``w0`` is rebuilt from the seed on
resume; its checksum, stored in every record, proves it is the same.
"""

from __future__ import annotations

import hashlib

import torch

from nitro_core.state.records import to_host


def checksum(tensors: list[torch.Tensor]) -> str:
    sha = hashlib.sha256()
    for t in tensors:
        sha.update(str((tuple(t.shape), str(t.dtype))).encode())
        sha.update(to_host(t).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


class W0Anchor:
    """Pulls every decayed parameter toward its initial value."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.groups = []
        w0_all = []
        for index, group in enumerate(optimizer.param_groups):
            decay = float(group.get("weight_decay", 0.0))
            params = list(group["params"])
            w0 = [p.detach().clone() for p in params]
            w0_all.extend(w0)
            if decay:
                group["weight_decay"] = 0.0
                self.groups.append((index, decay, params, w0))
        self.checksum = checksum(w0_all)

    @torch.no_grad()
    def apply(self) -> None:
        for index, decay, params, w0 in self.groups:
            # the group dict is looked up each step: load_state_dict replaces the dicts
            rate = float(self.optimizer.param_groups[index]["lr"]) * decay
            diffs = torch._foreach_sub(params, w0)
            torch._foreach_add_(params, diffs, alpha=-rate)
