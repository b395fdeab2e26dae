"""Tiny mixture-of-experts hybrid checkpoints written with transformers' own classes
(`Lfm2MoeForCausalLM`, `Qwen3_5MoeForCausalLM`), like tests/hybrid_files.py's dense ones, and
a capture of the experts transformers' routers choose.

Routing must be non-trivial on these: the experts' weights get fan-in scales (transformers'
3-D stacks would otherwise get 1/sqrt(2F*C) from the generic fill), LFM2-MoE's expert bias
(a buffer the generic fill skips) gets N(0, 0.05) so it moves some choices, and the sizes
(8 experts, top 2, over 16 tokens and 3-4 MoE layers) make every expert chosen somewhere.
Hidden sizes are multiples of 32 so that int8 quantizes the experts' gate/up and down."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

import hybrid_files as hf


@dataclass(frozen=True)
class Lfm2MoeDims:
    vocab: int = 96
    hidden: int = 64
    layer_types: tuple[str, ...] = ("conv", "full_attention", "conv", "conv", "full_attention")
    heads: int = 4  # head_dim 16
    kv_heads: int = 2
    ffn: int = 96  # the dense layers' SwiGLU
    dense_layers: int = 1
    experts: int = 8
    top_k: int = 2
    moe_ffn: int = 32
    expert_bias: bool = True
    norm_topk: bool = True
    scaling: float = 1.5


def _expert_scales(model: torch.nn.Module, seed: int) -> None:
    """Fan-in scales for the 3-D expert stacks [E, out, in]; a small random expert bias."""
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 3 and ".experts." in name:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
        for name, buf in model.named_buffers():
            if name.endswith("expert_bias"):
                buf.copy_(torch.randn(buf.shape, generator=g) * 0.05)


def write_lfm2_moe(folder: Path, d: Lfm2MoeDims = Lfm2MoeDims(), seed: int = 0) -> Path:
    """An `Lfm2MoeForCausalLM` folder, as save_pretrained writes it: one tensor per expert."""
    from transformers import Lfm2MoeConfig, Lfm2MoeForCausalLM

    config = Lfm2MoeConfig(
        vocab_size=d.vocab, hidden_size=d.hidden, intermediate_size=d.ffn, moe_intermediate_size=d.moe_ffn,
        num_hidden_layers=len(d.layer_types), layer_types=list(d.layer_types), num_attention_heads=d.heads,
        num_key_value_heads=d.kv_heads, num_dense_layers=d.dense_layers, num_experts=d.experts,
        num_experts_per_tok=d.top_k, use_expert_bias=d.expert_bias, norm_topk_prob=d.norm_topk,
        routed_scaling_factor=d.scaling, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Lfm2MoeForCausalLM(config).eval()
    hf._fill_trained_like(model, seed)
    _expert_scales(model, seed)
    return hf._save(model, folder, family="lfm2")


@torch.no_grad()
def routed_experts(folder: Path, tokens: list[int], router_class: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """transformers' routing of `tokens` (one full-sequence forward): per MoE layer in order,
    (chosen experts [T, k] as its router returns them, the scores the choice ranked [T, E])."""
    model = hf.load_transformers(folder)
    found = []

    def keep(module, args, out):
        scores = out[0].sigmoid() if module.__class__.__name__.startswith("Lfm2") else out[0].softmax(-1)
        bias = getattr(module, "_bias", None)
        found.append((out[2].clone(), scores + bias if bias is not None else scores))

    hooks = []
    for name, module in model.named_modules():
        if type(module).__name__ == router_class:
            parent = model.get_submodule(name.rsplit(".", 1)[0])
            module._bias = getattr(parent, "expert_bias", None) if getattr(parent, "use_expert_bias", False) else None
            hooks.append(module.register_forward_hook(keep))
    model(torch.tensor([tokens]), use_cache=False)
    for h in hooks:
        h.remove()
    return found


@dataclass(frozen=True)
class Qwen35MoeDims:
    experts: int = 8
    top_k: int = 2
    moe_ffn: int = 32
    shared_ffn: int = 48


def write_qwen35_moe(folder: Path, d: Qwen35MoeDims = Qwen35MoeDims(), seed: int = 0) -> Path:
    """A `Qwen3_5MoeForCausalLM` folder (`qwen3_5_moe_text`) on Qwen3.5's tiny non-square layers
    (hybrid_files.Qwen35Dims, hidden 64), as save_pretrained writes it: one tensor per expert."""
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    text = hf._qwen35_text_config(hf.Qwen35Dims(hidden=64))
    text.pop("intermediate_size")
    config = Qwen3_5MoeTextConfig(**text, num_experts=d.experts, num_experts_per_tok=d.top_k,
                                  moe_intermediate_size=d.moe_ffn, shared_expert_intermediate_size=d.shared_ffn)  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(config).eval()
    hf._fill_trained_like(model, seed)
    _expert_scales(model, seed)
    return hf._save(model, folder, family="qwen3_5")
