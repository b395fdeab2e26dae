"""LFM2 weights: canonical names are transformers' (`model.*`, nn.Linear [out, in]), the short
conv squeezed to [H, K], the head always present (a tied folder's is its embedding)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.hybrid import CONV
from ssmport.models.layers.attention import AttentionNames, attention_names, attention_shapes
from ssmport.models.lfm2.config import Lfm2Config, from_transformers
from ssmport.models.loading import check_layer_count, checked_view, head_name

EMBEDDING, HEAD = "model.embed_tokens.weight", "lm_head.weight"
CONV_WEIGHT = "conv.conv.weight"


def layer(i: int) -> str:
    return f"model.layers.{i}."


def attention(i: int) -> AttentionNames:
    return attention_names(layer(i) + "self_attn.", out="out_proj", norm="layernorm")


def dense_mlp_shapes(cfg: Lfm2Config, i: int) -> dict[str, tuple[int, ...]]:
    H, F, f = cfg.hidden_size, cfg.intermediate_size, layer(i) + "feed_forward."
    return {f + "w1.weight": (F, H), f + "w3.weight": (F, H), f + "w2.weight": (H, F)}


def attention_shapes_of(cfg: Lfm2Config, i: int) -> dict[str, tuple[int, ...]]:
    return attention_shapes(cfg.attention, attention(i), cfg.hidden_size)


def canonical_shapes(cfg: Lfm2Config, mlp=dense_mlp_shapes, attn=attention_shapes_of) -> dict[str, tuple[int, ...]]:
    """`mlp(cfg, i)`: the shapes of layer i's MLP (LFM2-MoE's experts past its dense layers);
    `attn(cfg, i)`: those of attention layer i (LFM3's names and per-kind specs)."""
    H, V = cfg.hidden_size, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {EMBEDDING: (V, H)}
    for i, kind in enumerate(cfg.layer_types):
        p = layer(i)
        shapes |= {p + "operator_norm.weight": (H,), p + "ffn_norm.weight": (H,)}
        if kind == CONV:
            c = p + "conv."
            shapes |= {c + "in_proj.weight": (3 * H, H), p + CONV_WEIGHT: (H, cfg.conv_kernel), c + "out_proj.weight": (H, H)}
            if cfg.conv_bias:
                shapes |= {c + "in_proj.bias": (3 * H,), c + "conv.bias": (H,), c + "out_proj.bias": (H,)}
        else:
            shapes |= attn(cfg, i)
        shapes |= mlp(cfg, i)
    return shapes | {"model.embedding_norm.weight": (H,), HEAD: (V, H)}


def load(cj: Mapping[str, Any], source: TensorSource, read=from_transformers, shapes=canonical_shapes,
         family: str = "LFM2") -> tuple[Lfm2Config, TensorSource]:  # fmt: skip
    """An `Lfm2ForCausalLM` folder (either config spelling); with another config reader
    `read(cj, origin) -> (config, tied)` and `shapes`, a sibling's (LFM3)."""
    cfg, tied = read(cj, source.origin)
    cfg.validate()
    check_layer_count(cfg.num_layers, source, "model.layers.", source.origin)
    head = head_name(tied, source, HEAD, EMBEDDING)
    return cfg, checked_view(source, shapes(cfg), {HEAD: head}, CONV_WEIGHT, f"{family} {cfg.describe()}")
