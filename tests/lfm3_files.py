"""A tiny LFM3 checkpoint written with transformers' own `Lfm3ForCausalLM` (its pure-torch path),
and transformers' logits for it.

Non-square: 4 heads of 16 over hidden 48 (q is 64 wide), 2 kv heads; window 8, so the test
streams wrap the sliding layers' rings several times; the full-attention layers' proportional
RoPE rotates half the pairs (partial_rotary_factor 0.5) at theta 1e6, the sliding layers' all
of them at 1e4. `Lfm3Dims` flips the options one by one (sandwich norms, the attention gate,
biases, an untied head, RoPE types).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

import hybrid_files as hf


@dataclass(frozen=True)
class Lfm3Dims:
    vocab: int = 96
    hidden: int = 48
    layer_types: tuple[str, ...] = ("conv", "sliding_attention", "full_attention", "conv", "sliding_attention", "conv")
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 96
    window: int = 8
    conv: int = 3
    sandwich: bool = True
    gate: bool = True
    attention_bias: bool = False
    conv_bias: bool = False
    tied: bool = True
    rope: dict = field(default_factory=lambda: {
        "full_attention": {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})  # fmt: skip


def write_lfm3(folder: Path, d: Lfm3Dims = Lfm3Dims(), seed: int = 0) -> Path:
    from transformers import Lfm3Config, Lfm3ForCausalLM

    config = Lfm3Config(
        vocab_size=d.vocab, hidden_size=d.hidden, intermediate_size=d.intermediate, num_hidden_layers=len(d.layer_types),
        layer_types=list(d.layer_types), num_attention_heads=d.heads, num_key_value_heads=d.kv_heads,
        head_dim=d.head_dim, sliding_window=d.window, conv_L_cache=d.conv, conv_bias=d.conv_bias,
        use_sandwich_norm=d.sandwich, use_attention_gate=d.gate, attention_bias=d.attention_bias,
        tie_word_embeddings=d.tied, rope_parameters=d.rope, max_position_embeddings=8192,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Lfm3ForCausalLM(config).eval()
    hf._fill_trained_like(model, seed)
    return hf._save(model, folder, family="lfm3")


@torch.no_grad()
def transformers_logits(folder: Path, tokens: list[int]) -> torch.Tensor:
    """fp32 logits [T, V] of transformers' model over the whole sequence (no cache), checked
    against its own cached token-by-token path (its sliding-window cache) to fp32 precision."""
    model = hf.load_transformers(folder)
    full = model(torch.tensor([tokens]), use_cache=False).logits[0].float()
    cache, rows = None, []
    for t in tokens:
        out = model(torch.tensor([[t]]), cache=cache, use_cache=True)
        cache = out.cache
        rows.append(out.logits[0, -1].float())
    scale = max(1.0, full.abs().max().item())
    torch.testing.assert_close(torch.stack(rows), full, rtol=0, atol=hf.STEP_VS_FULL_RTOL * scale)
    return full
