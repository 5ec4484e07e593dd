"""``CausalLM``: a tiny decoder-only transformer learning next-token prediction on synthetic
token sequences, trained the way long runs are (DESIGN.md section 9): bf16 autocast,
gradient accumulation, norm clipping, and checkpoint points every few optimizer steps with a
train split that can say where it stands (``TensorBatches``'s ``state_dict()``), so a
mid-epoch resume continues at the next batch."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from nitro_core.experiment import Experiment, Host
from nitro_core.policy.selectors import Best, Checkpointer, Last
from nitro_core.training.data import TensorBatches


class _Block(torch.nn.Module):
    """Pre-norm causal self-attention and an MLP, each a residual branch."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.ln2 = torch.nn.LayerNorm(width)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, T, D/H)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class _TinyGPT(torch.nn.Module):
    """Token and position embeddings, ``depth`` blocks, a final norm and a vocabulary head."""

    def __init__(self, vocab: int, context: int, width: int, heads: int, depth: int) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.Sequential(*(_Block(width, heads) for _ in range(depth)))
        self.ln = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, vocab)
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tokens(idx) + self.positions(pos))))


class CausalLM(Experiment):
    """Predict the next token of sequences drawn from a fixed random Markov chain (each token
    has a few likely successors), so the loss falls from log(vocab) toward the chain's
    entropy. bf16-mixed, two batches a step, clipping at 1.0, a checkpoint point every
    ``every_steps`` optimizer steps; keeps the best two and the latest two points."""

    # bounded, so a call cannot ask for 10**12 samples (an MCP client sets these fields)
    vocab: int = Field(64, ge=4, le=4096)
    context: int = Field(32, ge=2, le=1024)
    width: int = Field(32, ge=4, le=1024)
    heads: int = Field(2, ge=1, le=16)
    depth: int = Field(1, ge=1, le=12)
    samples: int = Field(512, ge=8, le=100_000)
    batch_size: int = Field(16, ge=1, le=100_000)
    lr: float = Field(3e-3, gt=0, le=10)
    mixed_precision: Literal["32-true", "bf16-mixed", "16-mixed"] = "bf16-mixed"
    accumulate: int = Field(2, ge=1, le=1024)
    clip: float = Field(1.0, gt=0, le=1e6)
    every_steps: Host[int] = Field(8, ge=1, le=1_000_000)  # points never move the trajectory
    max_epochs: Host[int] = Field(3, le=10_000)  # at least 1: Experiment checks it

    def build_data(self) -> dict[str, TensorBatches]:
        g = torch.Generator().manual_seed(2024)  # the data set is fixed, whatever the seed
        # each token's successors: three likely ones, the rest rare
        logits = torch.randn(self.vocab, self.vocab, generator=g)
        top = logits.topk(3, dim=1).indices
        logits.scatter_(1, top, 6.0)
        chain = torch.softmax(logits, dim=1)
        rows = self.samples + max(self.samples // 8, 1)
        seq = torch.empty(rows, self.context + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, self.vocab, (rows,), generator=g)
        for t in range(self.context):
            seq[:, t + 1] = torch.multinomial(chain[seq[:, t]], 1, generator=g).squeeze(1)
        x, y = seq[:, :-1], seq[:, 1:]
        cut = self.samples
        return {
            "train": TensorBatches({"x": x[:cut], "y": y[:cut]}, self.batch_size, shuffle=True),
            "val": TensorBatches({"x": x[cut:], "y": y[cut:]}, self.batch_size),
        }

    def build_model(self) -> torch.nn.Module:
        return _TinyGPT(self.vocab, self.context, self.width, self.heads, self.depth)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(batch["x"])  # (B, T, vocab)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch["y"].flatten())

    def metrics(
        self, model: torch.nn.Module, batch: dict[str, torch.Tensor]
    ) -> dict[str, tuple[torch.Tensor, int]]:
        correct = (model(batch["x"]).argmax(dim=-1) == batch["y"]).sum()
        return {"acc": (correct, batch["y"].numel())}

    def finalize_metrics(
        self, totals: dict[str, tuple[float, float]], split: str
    ) -> dict[str, float]:
        out = super().finalize_metrics(totals, split)
        if "loss" in out:
            out["ppl"] = math.exp(min(out["loss"], 50.0))
        return out

    def eval_loss(self) -> bool:
        return True

    def precision(self) -> Literal["32-true", "bf16-mixed", "16-mixed"]:
        return self.mixed_precision

    def accumulate_grad_batches(self) -> int:
        return self.accumulate

    def gradient_clip_val(self) -> float:
        return self.clip

    def checkpointer(self) -> Checkpointer:
        return Checkpointer(keep=(Best(2), Last(2)), every_steps=self.every_steps)
