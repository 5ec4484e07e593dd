"""Host copies of a training state for the asynchronous checkpoint writer.

Every leaf of a record (parameters, buffers, optimizer, EMA, scheduler, RNG and data state)
is copied into a host buffer that the copier owns and reuses from one record to the next,
so the only cost on the training thread is the copy itself: no allocation, no page faults
after the first record. A leaf on a CUDA device lands in pinned memory, copied without
blocking, and the copier waits for those copies once, at the end. The writer then reads
buffers the training step never touches, never a live tensor that the next optimizer step
mutates (the bug of Lightning#20953). At most one write is in flight, so one set of
buffers suffices: the next record reuses them only after the previous write is done.
"""

from __future__ import annotations

import torch


class HostCopier:
    """A :data:`~nitro_core.state.records.Leaf` that copies into reused host buffers."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._used: set[str] = set()
        self._devices: set[torch.device] = set()

    def __call__(self, name: str, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if t.device.type == "meta":
            return t  # no data to copy: the writer refuses it by name
        buffer = self._buffers.get(name)
        cuda = t.device.type == "cuda"
        if buffer is None or buffer.shape != t.shape or buffer.dtype != t.dtype:
            buffer = torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda)
            self._buffers[name] = buffer
        buffer.copy_(t, non_blocking=cuda)
        if cuda:
            self._devices.add(t.device)
        self._used.add(name)
        return buffer

    def finish(self) -> None:
        """Wait for the device copies, and drop the buffers of leaves this record lacked."""
        for device in self._devices:
            torch.cuda.synchronize(device)
        self._devices.clear()
        for name in self._buffers.keys() - self._used:
            del self._buffers[name]
        self._used.clear()

    @property
    def nbytes(self) -> int:
        """Host memory the buffers hold."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())
