"""RecurrentGemma weights: canonical names are transformers' (`model.*`, nn.Linear [out, in]),
the depthwise conv squeezed to [D, K], the head always present (a tied folder's is its embedding)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.layers.attention import AttentionNames, attention_names, attention_shapes
from ssmport.models.loading import check_layer_count, checked_view, head_name
from ssmport.models.recurrent_gemma.config import RECURRENT, RecurrentGemmaConfig, from_transformers

EMBEDDING, HEAD, FINAL_NORM = "model.embed_tokens.weight", "lm_head.weight", "model.final_norm.weight"
CONV_WEIGHT = "temporal_block.conv_1d.weight"
GATES = ("input_gate", "recurrent_gate")  # the RG-LRU's two block-diagonal gates


def layer(i: int) -> str:
    return f"model.layers.{i}."


def attention(cfg: RecurrentGemmaConfig, i: int) -> AttentionNames:
    """q/k/v biases only with attention_bias; o_proj always has one (zero-filled in neither case)."""
    names = attention_names(layer(i) + "temporal_block.", bias=True)
    if cfg.attention_bias:
        return names
    return AttentionNames(names.q, names.k, names.v, names.o, o_bias=names.o_bias)


def canonical_shapes(cfg: RecurrentGemmaConfig) -> dict[str, tuple[int, ...]]:
    H, D, F, V, heads = cfg.hidden_size, cfg.lru_width, cfg.intermediate_size, cfg.vocab_size, cfg.num_heads
    shapes: dict[str, tuple[int, ...]] = {EMBEDDING: (V, H)}
    for i, kind in enumerate(cfg.layer_types):
        p, m = layer(i), layer(i) + "mlp_block."
        shapes |= {p + "temporal_pre_norm.weight": (H,), p + "channel_pre_norm.weight": (H,)}
        if kind == RECURRENT:
            t = p + "temporal_block."
            for proj, (out, inp) in {"linear_x": (D, H), "linear_y": (D, H), "linear_out": (H, D)}.items():
                shapes |= {f"{t}{proj}.weight": (out, inp), f"{t}{proj}.bias": (out,)}
            shapes |= {p + CONV_WEIGHT: (D, cfg.conv_width), t + "conv_1d.bias": (D,), t + "rg_lru.recurrent_param": (D,)}
            for g in GATES:
                shapes |= {f"{t}rg_lru.{g}_weight": (heads, D // heads, D // heads), f"{t}rg_lru.{g}_bias": (heads, D // heads)}
        else:
            shapes |= attention_shapes(cfg.attention, attention(cfg, i), H)
            if not cfg.attention_bias:
                shapes |= {attention(cfg, i).o_bias: (H,)}
        for proj, (out, inp) in {"gate_proj": (F, H), "up_proj": (F, H), "down_proj": (H, F)}.items():
            shapes |= {f"{m}{proj}.weight": (out, inp), f"{m}{proj}.bias": (out,)}
    return shapes | {FINAL_NORM: (H,), HEAD: (V, H)}


def load(cj: Mapping[str, Any], source: TensorSource) -> tuple[RecurrentGemmaConfig, TensorSource]:
    """A `RecurrentGemmaForCausalLM` folder."""
    cfg, tied = from_transformers(cj, source.origin)
    cfg.validate()
    check_layer_count(cfg.num_layers, source, "model.layers.", source.origin)
    head = head_name(tied, source, HEAD, EMBEDDING)
    return cfg, checked_view(source, canonical_shapes(cfg), {HEAD: head}, CONV_WEIGHT, f"RecurrentGemma {cfg.describe()}")
