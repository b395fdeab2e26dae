"""Granite-4.0-H weights: canonical names are transformers' (`model.*`, nn.Linear [out, in]),
the Mamba-2 conv squeezed to [C, K], the head always present (a tied folder's is its embedding)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.checkpoint import TensorSource
from ssmport.models.granite_hybrid.config import MAMBA, GraniteHybridConfig, from_transformers
from ssmport.models.layers import AttentionNames, attention_names, attention_shapes
from ssmport.models.loading import check_layer_count, checked_view, head_name
from ssmport.models.mamba2.checkpoints import mixer_shapes

EMBEDDING, HEAD, FINAL_NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"


def layer(i: int) -> str:
    return f"model.layers.{i}."


def attention(cfg: GraniteHybridConfig, i: int) -> AttentionNames:
    return attention_names(layer(i) + "self_attn.", bias=cfg.attention_bias)


def canonical_shapes(cfg: GraniteHybridConfig) -> dict[str, tuple[int, ...]]:
    H, V, F = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {EMBEDDING: (V, H)}
    for i, kind in enumerate(cfg.layer_types):
        p = layer(i)
        shapes |= {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,)}
        if kind == MAMBA:
            shapes |= mixer_shapes(cfg.mixer, p + "mamba.", H)
        else:
            shapes |= attention_shapes(cfg.attention, attention(cfg, i), H)
        shapes |= {p + "shared_mlp.input_linear.weight": (2 * F, H), p + "shared_mlp.output_linear.weight": (H, F)}
    return shapes | {FINAL_NORM: (H,), HEAD: (V, H)}


def load(cj: Mapping[str, Any], source: TensorSource) -> tuple[GraniteHybridConfig, TensorSource]:
    """A dense `GraniteMoeHybridForCausalLM` folder."""
    cfg, tied = from_transformers(cj, source.origin)
    cfg.validate()
    check_layer_count(cfg.num_layers, source, "model.layers.", source.origin)
    head = head_name(tied, source, HEAD, EMBEDDING)
    return cfg, checked_view(source, canonical_shapes(cfg), {HEAD: head}, "conv1d.weight", f"Granite-4.0-H {cfg.describe()}")
