"""Qwen3.5 weights. Canonical names are transformers' text-only names (`Qwen3_5ForCausalLM`:
`model.*`, `lm_head.weight`), nn.Linear [out, in], conv [D, 1, K].

Released folders are `Qwen3_5ForConditionalGeneration`: the language model under
`model.language_model.*`, and two groups of tensors that are not part of it, which are left
out by prefix (and said so in the manifest and in one line of output), never by a loose load:
the vision tower `model.visual.*` and the multi-token-prediction head `mtp.*`.

The head is loaded instead (strictly: every one of its tensors, by name and shape) when
config.json says mtp_num_hidden_layers >= 1 and the checkpoint has `mtp.*` tensors: it becomes
the draft function of `export --verify K` (ssmport.models.qwen3_5.mtp). Its canonical names are
the checkpoint's (`mtp.fc.weight`, `mtp.layers.0.self_attn.q_proj.weight`, ...); the manifest
still lists it as skipped unless the bundle carries that function."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.layers.attention import AttentionNames, attention_names, attention_shapes
from ssmport.errors import CheckpointError
from ssmport.models.loading import ConfigReader, check_layer_count, checked_view, head_name
from ssmport.models.qwen3_5.config import FULL, Qwen35Config, from_hf

EMBED, HEAD, NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"
VLM_PREFIX = "model.language_model."
# Tensors of the released packaging that the language model does not use: prefix -> what.
MTP_PREFIX = "mtp."
SKIPPED = {"model.visual.": "vision tower", MTP_PREFIX: "multi-token prediction head"}
MTP_LAYER = MTP_PREFIX + "layers.0."  # the one MTP layer (mtp_num_hidden_layers = 1)
MTP_FC, MTP_NORM = MTP_PREFIX + "fc.weight", MTP_PREFIX + "norm.weight"
MTP_NORM_EMBEDDING, MTP_NORM_HIDDEN = MTP_PREFIX + "pre_fc_norm_embedding.weight", MTP_PREFIX + "pre_fc_norm_hidden.weight"


def layer(i: int) -> str:
    return f"model.layers.{i}."


def attention(cfg: Qwen35Config, i: int, prefix: str | None = None) -> AttentionNames:
    """Layer i's attention names (`prefix`: another layer's, the MTP layer's)."""
    return attention_names((prefix or layer(i)) + "self_attn.", norm="norm", bias=cfg.attention_bias)


def _decoder_layer_shapes(cfg: Qwen35Config, p: str) -> dict[str, tuple[int, ...]]:
    """The norms and SwiGLU MLP every layer (and the MTP layer) has, under prefix p."""
    C, F = cfg.hidden_size, cfg.intermediate_size
    return {p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
            p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C), p + "mlp.down_proj.weight": (C, F)}  # fmt: skip


def mtp_shapes(cfg: Qwen35Config) -> dict[str, tuple[int, ...]]:
    """The multi-token-prediction head's tensors: two norms, fc [C, 2C] over [embedding | hidden],
    one full-attention decoder layer, its final norm (the embedding and lm_head are the model's)."""
    C = cfg.hidden_size
    shapes = {MTP_NORM_EMBEDDING: (C,), MTP_NORM_HIDDEN: (C,), MTP_FC: (C, 2 * C), MTP_NORM: (C,)}
    shapes |= _decoder_layer_shapes(cfg, MTP_LAYER)
    return shapes | attention_shapes(cfg.attention, attention(cfg, 0, MTP_LAYER), C)


def canonical_shapes(cfg: Qwen35Config) -> dict[str, tuple[int, ...]]:
    C, V, d = cfg.hidden_size, cfg.vocab_size, cfg.delta_rule
    shapes: dict[str, tuple[int, ...]] = {EMBED: (V, C)}
    for i, kind in enumerate(cfg.layer_types):
        p = layer(i)
        shapes |= _decoder_layer_shapes(cfg, p)
        if kind == FULL:
            shapes |= attention_shapes(cfg.attention, attention(cfg, i), C)
        else:
            a, HV = p + "linear_attn.", d.v_heads
            shapes |= {a + "in_proj_qkv.weight": (d.conv_dim, C), a + "in_proj_z.weight": (d.value_dim, C),
                       a + "in_proj_b.weight": (HV, C), a + "in_proj_a.weight": (HV, C),
                       a + "conv1d.weight": (d.conv_dim, 1, d.conv_kernel), a + "dt_bias": (HV,),
                       a + "A_log": (HV,), a + "norm.weight": (d.v_dim,), a + "out_proj.weight": (C, d.value_dim)}  # fmt: skip
    return shapes | {NORM: (C,), HEAD: (V, C)} | (mtp_shapes(cfg) if cfg.mtp_layers else {})


def load_hf(cj: Mapping[str, Any], source: TensorSource) -> tuple[Qwen35Config, TensorSource]:
    """A `Qwen3_5ForCausalLM` folder (`model.*`) or the released `Qwen3_5ForConditionalGeneration`
    packaging (`model.language_model.*`, plus the skipped groups)."""
    cfg = from_hf(cj, source.origin)
    prefix = VLM_PREFIX if any(n.startswith(VLM_PREFIX) for n in source) else "model."
    to_source = lambda name: prefix + name.removeprefix("model.") if name.startswith("model.") else name  # noqa: E731
    check_layer_count(cfg.num_layers, source, prefix + "layers.", source.origin)
    cfg = _with_mtp(cfg, cj, source)
    shapes = canonical_shapes(cfg)
    renamed = {n: to_source(n) for n in shapes} | {HEAD: head_name(cfg.tie_word_embeddings, source, HEAD, to_source(EMBED))}
    skipped = {n: source.shape(n) for n in source if n.startswith(tuple(SKIPPED)) and n not in shapes}
    packaging = "Qwen3_5ForConditionalGeneration layout" if prefix == VLM_PREFIX else "Qwen3_5ForCausalLM layout"
    # the head stays listed as skipped (the manifest's record) until an export uses it
    counts = {p: sum(n.startswith(p) for n in source if n.startswith(tuple(SKIPPED))) for p in SKIPPED}
    return cfg, checked_view(source, shapes, renamed, None, f"Qwen3.5 {cfg.describe()} ({packaging})", optional=skipped,
                             skipped={p: (SKIPPED[p], k) for p, k in counts.items() if k})  # fmt: skip


def _with_mtp(cfg: Qwen35Config, cj: Mapping[str, Any], source: TensorSource) -> Qwen35Config:
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
