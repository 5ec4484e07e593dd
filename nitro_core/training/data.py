"""A small re-iterable batcher over in-memory tensors, for examples and tests.

Shuffling draws from torch's global generator, so a resumed run, whose generator state is
restored from its record, draws the same order the uninterrupted run would have.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from nitro_core.errors import ConfigError


class TensorBatches:
    """Batches of dicts of tensors sliced along the first dimension."""

    def __init__(
        self, tensors: Mapping[str, torch.Tensor], batch_size: int, shuffle: bool = False
    ) -> None:
        sizes = {len(t) for t in tensors.values()}
        if len(sizes) != 1:
            raise ConfigError(
                f"TensorBatches: the tensors have lengths {sorted(sizes)}; give tensors of one length "
                "(rows along the first dimension), e.g. TensorBatches({'x': x, 'y': y}, 32)."
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(
                f"TensorBatches(batch_size={batch_size!r}): write a positive integer, e.g. 32."
            )
        self.tensors = dict(tensors)
        self.n = sizes.pop()
        self.batch_size = batch_size
        self.shuffle = shuffle

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        order = torch.randperm(self.n) if self.shuffle else None
        for start in range(0, self.n, self.batch_size):
            if order is None:
                yield {k: t[start : start + self.batch_size] for k, t in self.tensors.items()}
            else:
                idx = order[start : start + self.batch_size]
                yield {k: t[idx] for k, t in self.tensors.items()}
