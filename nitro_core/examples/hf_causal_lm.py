"""``HFCausalLM``: a tiny ``transformers`` causal language model (GPT-2 or Llama), built from
a config (nothing is downloaded), learning the synthetic token chain of
:class:`~nitro_core.examples.causal_lm.CausalLM`. The model is the ``transformers`` model
itself, so its state-dict names are Hugging Face's and its ``.config`` is what ``export_hf``
writes as ``config.json``. Needs the extra ``nitro[hf]``; ``transformers`` is imported only
when a model is built, so ``import nitro_core`` never imports it."""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

import torch
from pydantic import Field

from nitro_core.errors import ConfigError
from nitro_core.examples.causal_lm import CausalLM
from nitro_core.experiment import Host
from nitro_core.policy.selectors import Checkpointer, Last


def transformers_installed() -> bool:
    """Whether ``transformers`` can be imported (without importing it)."""
    return importlib.util.find_spec("transformers") is not None


def _transformers() -> Any:
    try:
        import transformers  # lazy: the optional extra nitro[hf]
    except ImportError:
        raise ConfigError(
            "HFCausalLM builds a transformers model, and transformers is not installed; "
            "install the extra: pip install 'nitro[hf]'."
        ) from None
    return transformers


class HFCausalLM(CausalLM):
    """A ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` of ``depth`` layers on the synthetic
    chain, in float32 (``CausalLM``'s data, loss and metrics; the logits are the model
    output's ``.logits``). ``tie`` ties the output head to the token embedding."""

    arch: Literal["gpt2", "llama"] = "gpt2"
    tie: bool = True
    depth: int = Field(2, ge=1, le=12)
    samples: int = Field(256, ge=8, le=100_000)
    mixed_precision: Literal["32-true", "bf16-mixed", "16-mixed"] = "32-true"
    accumulate: int = Field(1, ge=1, le=1024)
    every_steps: Host[int] = Field(1_000_000, ge=1, le=1_000_000)  # epoch ends only
    max_epochs: Host[int] = Field(2, le=10_000)

    def hf_config(self) -> Any:
        """The ``transformers`` config of the model (a ``GPT2Config`` or ``LlamaConfig``)."""
        tf = _transformers()
        if self.arch == "gpt2":
            return tf.GPT2Config(
                vocab_size=self.vocab, n_positions=self.context, n_embd=self.width,
                n_layer=self.depth, n_head=self.heads, tie_word_embeddings=self.tie,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                bos_token_id=self.vocab - 1, eos_token_id=self.vocab - 1,
            )  # fmt: skip
        return tf.LlamaConfig(
            vocab_size=self.vocab, hidden_size=self.width, intermediate_size=2 * self.width,
            num_hidden_layers=self.depth, num_attention_heads=self.heads,
            num_key_value_heads=self.heads, max_position_embeddings=self.context,
            tie_word_embeddings=self.tie,
        )  # fmt: skip

    def build_model(self) -> torch.nn.Module:
        model: torch.nn.Module = _transformers().AutoModelForCausalLM.from_config(self.hf_config())
        return model

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(input_ids=batch["x"]).logits  # (B, T, vocab)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch["y"].flatten())

    def metrics(
        self, model: torch.nn.Module, batch: dict[str, torch.Tensor]
    ) -> dict[str, tuple[torch.Tensor, int]]:
        correct = (model(input_ids=batch["x"]).logits.argmax(dim=-1) == batch["y"]).sum()
        return {"acc": (correct, batch["y"].numel())}

    def checkpointer(self) -> Checkpointer:
        return Checkpointer(keep=(Last(5),))
