"""Falcon-H1 weights: canonical names are transformers' (`model.*`, nn.Linear [out, in]), the
Mamba-2 conv squeezed to [C, K], the head always present (a tied folder's is its embedding)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.falcon_h1.config import FalconH1Config, from_transformers
from ssmport.models.layers.attention import AttentionNames, attention_names, attention_shapes
from ssmport.models.loading import check_layer_count, checked_view, head_name
from ssmport.models.mamba2.checkpoints import mixer_shapes

EMBEDDING, HEAD, FINAL_NORM = "model.embed_tokens.weight", "lm_head.weight", "model.final_layernorm.weight"


def layer(i: int) -> str:
    return f"model.layers.{i}."


def attention(cfg: FalconH1Config, i: int) -> AttentionNames:
    return attention_names(layer(i) + "self_attn.", bias=cfg.attention_bias)


def mlp(i: int) -> tuple[str, str, str]:
    p = layer(i) + "feed_forward."
    return p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"


def canonical_shapes(cfg: FalconH1Config) -> dict[str, tuple[int, ...]]:
    H, V, F = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {EMBEDDING: (V, H)}
    for i in range(cfg.num_layers):
        p, (gate, up, down) = layer(i), mlp(i)
        shapes |= {p + "input_layernorm.weight": (H,), p + "pre_ff_layernorm.weight": (H,)}
        shapes |= mixer_shapes(cfg.mixer, p + "mamba.", H) | attention_shapes(cfg.attention, attention(cfg, i), H)
        shapes |= {gate: (F, H), up: (F, H), down: (H, F)}
    return shapes | {FINAL_NORM: (H,), HEAD: (V, H)}


def load(cj: Mapping[str, Any], source: TensorSource) -> tuple[FalconH1Config, TensorSource]:
    """A `FalconH1ForCausalLM` folder. A stored `mamba.mup_vector` (transformers keeps it out of
    the state dict; older conversions may carry it) is accepted and not read: it follows from
    ssm_multipliers."""
    cfg, tied = from_transformers(cj, source.origin)
    cfg.validate()
    check_layer_count(cfg.num_layers, source, "model.layers.", source.origin)
    head = head_name(tied, source, HEAD, EMBEDDING)
    mup = {f"{layer(i)}mamba.mup_vector": (1, 1, cfg.mixer.in_proj_size) for i in range(cfg.num_layers)}
    return cfg, checked_view(source, canonical_shapes(cfg), {HEAD: head}, "conv1d.weight", f"Falcon-H1 {cfg.describe()}",
                             optional=mup)  # fmt: skip
