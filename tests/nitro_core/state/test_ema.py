"""The EMA tracker: one lerp per step over every floating tensor, whatever their types."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from nitro_core.state.ema import EMATracker


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)
    )


def _step(model: torch.nn.Module) -> None:
    """One training step: BatchNorm's statistics updated, the parameters moved by SGD."""
    model.train()
    loss = model(torch.randn(16, 4, generator=torch.Generator().manual_seed(1))).square().mean()
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()


def _plain_average(decay: float) -> dict[str, torch.Tensor]:
    model = _model()
    ema = EMATracker(model, decay)
    _step(model)
    ema.update()
    return ema.shadow


def test_an_fsdp_model_s_dtensor_weights_and_plain_buffers_average_like_a_plain_model(tmp_path):
    # under FSDP the parameters are DTensors and BatchNorm's buffers plain tensors: one foreach
    # call over both raised "got mixed torch.Tensor and DTensor" at the first step
    expected = _plain_average(0.9)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = _model()
        fully_shard(model)
        assert isinstance(model[0].weight, DTensor) and not isinstance(
            model[1].running_mean, DTensor
        )
        ema = EMATracker(model, 0.9)
        _step(model)
        ema.update()
        got = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in ema.shadow.items()}
    finally:
        dist.destroy_process_group()
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    assert ema.num_updates == 1
