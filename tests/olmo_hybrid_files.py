"""Tiny OLMo-Hybrid checkpoints written with transformers' own `OlmoHybridForCausalLM`
(docs/hybrids.md, section 7), and the three spellings a folder may use.

`write_olmo_hybrid` builds the model from a non-square config (kv heads != heads, k dim != v
dim, v heads != k heads, both layer kinds), overwrites every parameter with seeded
trained-like values (hybrid_files._fill_trained_like: norm gains N(1, 0.1), A in [1, 16], dt
in [0.02, 0.2]) and saves it with `save_pretrained`, which in transformers 5.24 writes the
OLMo-core names (`attention_layer_norm`, `feedforward_layer_norm`, `{q,k,v}_conv1d`, the
latter three equal parts of the q | k | v rows). `respell` rewrites such a folder as the
released split (q / k / v rows each in its own conv) or in transformers' in-memory names
(one `conv1d`, `input_layernorm`, `post_attention_layernorm`); transformers loads all three.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hybrid_checks import rewrite, tensors_of

import hybrid_files as hf

LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class OlmoHybridDims:
    vocab: int = 96
    hidden: int = 48
    ffn: int = 80
    layer_types: tuple[str, ...] = (LINEAR, LINEAR, FULL, LINEAR, FULL)
    heads: int = 4  # head_dim 12 (hidden / heads)
    kv_heads: int = 2
    k_heads: int = 2
    v_heads: int = 4  # 2 value heads per q/k head
    k_dim: int = 8
    v_dim: int = 12
    conv: int = 4
    rope_theta: float = 10000.0
    neg_eigval: bool = True
    tied: bool = False
    extra: dict = field(default_factory=dict)  # more OlmoHybridConfig keys

    def config(self) -> dict:
        return {"vocab_size": self.vocab, "hidden_size": self.hidden, "intermediate_size": self.ffn,
                "num_hidden_layers": len(self.layer_types), "layer_types": list(self.layer_types),
                "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
                "linear_num_key_heads": self.k_heads, "linear_num_value_heads": self.v_heads,
                "linear_key_head_dim": self.k_dim, "linear_value_head_dim": self.v_dim,
                "linear_conv_kernel_dim": self.conv, "linear_allow_neg_eigval": self.neg_eigval,
                "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
                "tie_word_embeddings": self.tied, "max_position_embeddings": 256, "pad_token_id": 0,
                "eos_token_id": 2} | self.extra  # fmt: skip


def write_olmo_hybrid(folder: Path, d: OlmoHybridDims = OlmoHybridDims(), seed: int = 0, beta_scale: float = 1.0) -> Path:
    """`beta_scale` multiplies b_proj (no bias there): 4 pushes beta = 2 sigmoid(.) towards 0
    and 2, so the negative-eigenvalue range is exercised, not only beta near 1."""
    from transformers import OlmoHybridConfig, OlmoHybridForCausalLM

    torch.manual_seed(seed)
    model = OlmoHybridForCausalLM(OlmoHybridConfig(**d.config())).eval()
    hf._fill_trained_like(model, seed)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                layer.linear_attn.b_proj.weight.mul_(beta_scale)
    return hf._save(model, folder, family="qwen3_5")


def respell(folder: Path, dst: Path, spelling: str, d: OlmoHybridDims = OlmoHybridDims()) -> Path:
    """A copy of a `write_olmo_hybrid` folder in another spelling: "released" (q / k / v rows
    each in its own conv) or "transformers" (in-memory names, one conv1d)."""
    tensors = tensors_of(folder)
    for name in [n for n in tensors if n.endswith("q_conv1d.weight")]:
        base = name.removesuffix("q_conv1d.weight")
        conv = torch.cat([tensors.pop(base + p + "_conv1d.weight") for p in "qkv"])
        if spelling == "transformers":
            tensors[base + "conv1d.weight"] = conv
        else:
            sizes = [d.k_heads * d.k_dim, d.k_heads * d.k_dim, d.v_heads * d.v_dim]
            tensors |= {base + p + "_conv1d.weight": c.clone() for p, c in zip("qkv", conv.split(sizes))}
    if spelling == "transformers":
        renames = {"attention_layer_norm": "input_layernorm", "feedforward_layer_norm": "post_attention_layernorm"}
        tensors = {_rename(n, renames): t for n, t in tensors.items()}
    return rewrite(folder, dst, tensors)


def _rename(name: str, renames: dict[str, str]) -> str:
    for old, new in renames.items():
        name = name.replace(f".{old}.", f".{new}.")
    return name


def load_transformers(folder: Path):
    """transformers' own OlmoHybridForCausalLM for a fixture folder, fp32, eval, torch paths only."""
    from transformers import OlmoHybridForCausalLM

    hf.assert_torch_paths()
    assert json.loads((Path(folder) / "config.json").read_text())["architectures"] == ["OlmoHybridForCausalLM"]
    return OlmoHybridForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
