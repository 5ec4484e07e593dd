"""A small re-iterable batcher over in-memory tensors, for examples and tests.

Shuffling draws from torch's global generator, so a resumed run, whose generator state is
restored from its record, draws the same order the uninterrupted run would have.

``TensorBatches`` also speaks the protocol of torchdata's ``StatefulDataLoader``:
``state_dict()`` says where the pass in progress stands (the generator state its order was
drawn from, and the batches yielded) and ``load_state_dict()`` makes the next pass continue
from there, so a mid-epoch resume costs O(1) instead of a replay of the epoch's batches.

Under several processes (``torchrun``) the handle trains on :meth:`TensorBatches.shard`:
like torch's ``DistributedSampler``, every rank draws the same order, pads it to a multiple
of the world size with its first rows, and takes every ``world``-th row from its rank on,
so every rank yields the same number of batches. After ``k`` batches per rank the ranks
have consumed exactly the first ``k * batch_size * world`` rows of the order, which is what
lets a mid-epoch position carry over to another world size.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

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
        self._order_rng: torch.Tensor | None = None  # the pass in progress drew its order here
        self._yielded = 0  # batches the pass in progress has yielded
        self._resume: tuple[int, torch.Tensor | None] | None = None  # set by load_state_dict
        self.rank, self.world, self.pad = 0, 1, True  # this process's shard (see shard())

    def shard(self, rank: int, world: int, pad: bool = True) -> TensorBatches:
        """This rank's share of the batches (the same tensors, not copied): every
        ``world``-th row of each pass's order, from row ``rank``. ``pad``: repeat the
        order's first rows so that every rank yields as many batches (training, where the
        ranks step together); without it the last ranks may get a row fewer (evaluation,
        where each row must count once)."""
        if not 0 <= rank < world:
            raise ConfigError(f"TensorBatches.shard: rank {rank} is not in 0..{world - 1}.")
        part = TensorBatches(self.tensors, self.batch_size, self.shuffle)
        part.rank, part.world, part.pad = rank, world, pad
        return part

    def _rows(self) -> int:
        """Rows this shard yields a pass."""
        if self.world == 1:
            return self.n
        if self.pad:
            return -(-self.n // self.world)
        return len(range(self.rank, self.n, self.world))

    def __len__(self) -> int:
        return -(-self._rows() // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        start, rng_state = self._resume if self._resume is not None else (0, None)
        self._resume = None
        order = None
        if self.shuffle and rng_state is not None:  # continue a recorded pass: its own order
            generator = torch.Generator()
            generator.set_state(rng_state)
            order = torch.randperm(self.n, generator=generator)
        elif self.shuffle:  # a new pass: draw the order from the global generator
            rng_state = torch.get_rng_state()
            order = torch.randperm(self.n)
        self._order_rng, self._yielded = rng_state, start
        if self.world > 1:  # this rank's rows of the (padded) order
            rows = order if order is not None else torch.arange(self.n)
            if self.pad and self.n % self.world:
                extra = self.world - self.n % self.world
                rows = torch.cat([rows, rows.repeat(-(-extra // self.n))[:extra]])
            order = rows[self.rank :: self.world]
        for first in range(start * self.batch_size, self._rows(), self.batch_size):
            if order is None:
                batch = {k: t[first : first + self.batch_size] for k, t in self.tensors.items()}
            else:
                idx = order[first : first + self.batch_size]
                batch = {k: t[idx] for k, t in self.tensors.items()}
            self._yielded += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Where the pass in progress stands: ``{"yielded": batches, "order_rng": the CPU
        generator state its order was drawn from (None unshuffled)}``."""
        state: dict[str, Any] = {"yielded": self._yielded, "order_rng": self._order_rng}
        if self.world > 1:
            state["world"] = self.world
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next pass continue the recorded one after its ``yielded`` batches (a
        pass that had ended starts afresh)."""
        yielded = state.get("yielded")
        if isinstance(yielded, bool) or not isinstance(yielded, int) or yielded < 0:
            raise ConfigError(
                f"TensorBatches.load_state_dict: 'yielded' is {yielded!r}; give the state_dict() "
                "of a TensorBatches, e.g. {'yielded': 3, 'order_rng': None}."
            )
        rng_state = state.get("order_rng")
        if self.shuffle and rng_state is None and yielded:
            raise ConfigError(
                "TensorBatches.load_state_dict: the state has no 'order_rng', but these batches "
                "are shuffled; give the state_dict() of a TensorBatches with shuffle=True."
            )
        world = state.get("world", 1)
        if world != self.world and isinstance(world, int) and world > 0:
            # the ranks had consumed the order's first yielded * batch_size * world rows
            yielded = yielded * world // self.world
        done = yielded >= len(self)
        self._resume = None if done else (yielded, rng_state if self.shuffle else None)
