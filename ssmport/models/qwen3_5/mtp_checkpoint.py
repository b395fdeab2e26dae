"""Qwen3.5's multi-token-prediction head in a checkpoint: its tensors' names and shapes, the
names and shapes it shares with every decoder layer, and whether config.json declares it.
The head as a draft function: ssmport.models.qwen3_5.mtp."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ssmport.errors import CheckpointError
from ssmport.loader.checkpoint import TensorSource
from ssmport.models.layers.attention import AttentionNames, attention_names, attention_shapes
from ssmport.models.loading import ConfigReader
from ssmport.models.qwen3_5.config import Qwen35Config

MTP_PREFIX = "mtp."
MTP_LAYER = MTP_PREFIX + "layers.0."  # the one MTP layer (mtp_num_hidden_layers = 1)
MTP_FC, MTP_NORM = MTP_PREFIX + "fc.weight", MTP_PREFIX + "norm.weight"
MTP_NORM_EMBEDDING, MTP_NORM_HIDDEN = MTP_PREFIX + "pre_fc_norm_embedding.weight", MTP_PREFIX + "pre_fc_norm_hidden.weight"


def layer_attention(cfg: Qwen35Config, p: str) -> AttentionNames:
    """The attention names of the full-attention layer stored under prefix p."""
    return attention_names(p + "self_attn.", norm="norm", bias=cfg.attention_bias)


def decoder_layer_shapes(cfg: Qwen35Config, p: str) -> dict[str, tuple[int, ...]]:
    """The norms and SwiGLU MLP every layer (and the MTP layer) has, under prefix p."""
    C, F = cfg.hidden_size, cfg.intermediate_size
    return {p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
            p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C), p + "mlp.down_proj.weight": (C, F)}  # fmt: skip


def mtp_shapes(cfg: Qwen35Config) -> dict[str, tuple[int, ...]]:
    """The head's tensors: two norms, fc [C, 2C] over [embedding | hidden], one full-attention
    decoder layer, its final norm (the embedding and lm_head are the model's)."""
    C = cfg.hidden_size
    shapes = {MTP_NORM_EMBEDDING: (C,), MTP_NORM_HIDDEN: (C,), MTP_FC: (C, 2 * C), MTP_NORM: (C,)}
    shapes |= decoder_layer_shapes(cfg, MTP_LAYER)
    return shapes | attention_shapes(cfg.attention, layer_attention(cfg, MTP_LAYER), C)


def with_mtp(cfg: Qwen35Config, cj: Mapping[str, Any], source: TensorSource) -> Qwen35Config:
    """The config with its MTP head when config.json declares one (mtp_num_hidden_layers >= 1)
    and the checkpoint has `mtp.*` tensors; otherwise unchanged (the tensors, if any, skipped)."""
    text = cj.get("text_config", cj)
    declared = ConfigReader(text, source.origin, "Qwen3.5").int("mtp_num_hidden_layers", 0, lo=0) if isinstance(text, Mapping) else 0
    if not declared or not any(n.startswith(MTP_PREFIX) for n in source):
        return cfg
    if declared > 1:
        raise CheckpointError(f"{source.origin}: config.json mtp_num_hidden_layers={declared}: ssmport's draft function "
                              "runs one MTP layer (the released Qwen3.5 have one)")  # fmt: skip
    return replace(cfg, mtp_layers=1)
