"""Tiny RecurrentGemma checkpoints written with transformers' own `RecurrentGemmaForCausalLM`,
and its logits. Non-square on purpose: lru_width 40 != hidden 96, 2 kv heads of 4, a rotary
half of each 24-wide head, q/k/v biases on, and a window of 8 so that a 40-token stream
wraps the attention ring five times. transformers' cached one-token path cannot start a
sequence when lru_width != hidden_size (its first conv state is hidden_size wide), so its
full-sequence forward is the reference (the sliding-window mask over the whole sequence)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

import hybrid_files as hf

TOKENS = [3, 17, 5, 60, 9, 11, 2, 44, 80, 7, 30, 12, 12, 12, 91, 0, 5, 5, 33, 64,
          71, 8, 19, 19, 40, 2, 95, 13, 6, 50, 27, 3, 17, 5, 60, 88, 1, 42, 42, 10]  # fmt: skip


@dataclass(frozen=True)
class Dims:
    vocab: int = 96
    hidden: int = 96  # sqrt(96) = 9.798 is 9.8125 in bf16; a multiple of 32, so int8 blocks fit
    layers: int = 5
    block_types: tuple[str, ...] = ("recurrent", "attention", "recurrent")  # -> r a r r a
    heads: int = 4  # head_dim 24, rotary 12
    kv_heads: int = 2
    lru_width: int = 40  # 4 gate blocks of 10
    intermediate: int = 128  # the MLP is 64 wide (transformers halves it)
    window: int = 8
    conv: int = 4
    soft_cap: float = 30.0
    attention_bias: bool = True


def write(folder: Path, d: Dims = Dims(), seed: int = 0) -> Path:
    """A `RecurrentGemmaForCausalLM` folder with seeded trained-like weights: Λ spread so the
    per-token decay a runs from 0.9999 to e^-16 (slow and strong channels side by side)."""
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM

    config = RecurrentGemmaConfig(
        vocab_size=d.vocab, hidden_size=d.hidden, num_hidden_layers=d.layers, block_types=list(d.block_types),
        num_attention_heads=d.heads, num_key_value_heads=d.kv_heads, lru_width=d.lru_width,
        intermediate_size=d.intermediate, attention_window_size=d.window, conv1d_width=d.conv,
        logits_soft_cap=d.soft_cap, attention_bias=d.attention_bias,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = RecurrentGemmaForCausalLM(config).eval()
    hf._fill_trained_like(model, seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "recurrent_param"):  # softplus(Λ) in [1e-5, 2]
                module.recurrent_param.copy_(torch.empty(d.lru_width).uniform_(-11.0, 2.0, generator=g))
    return hf._save(model, folder, family="recurrent_gemma")


@torch.no_grad()
def full_logits(folder: Path, tokens: list[int]) -> torch.Tensor:
    """transformers' fp32 logits [T, V], one full-sequence forward (pure torch: sdpa / eager)."""
    from transformers import RecurrentGemmaForCausalLM

    model = RecurrentGemmaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return model(torch.tensor([tokens]), use_cache=False).logits[0].float()
