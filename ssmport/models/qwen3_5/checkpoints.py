"""Qwen3.5 weights. Canonical names are transformers' text-only names (`Qwen3_5ForCausalLM`:
`model.*`, `lm_head.weight`), nn.Linear [out, in], conv [D, 1, K].

Released folders are `Qwen3_5ForConditionalGeneration`: the language model under
`model.language_model.*`, and two groups of tensors that are not part of it, which are left
out by prefix (and said so in the manifest and in one line of output), never by a loose load:
the vision tower `model.visual.*` and the multi-token-prediction head `mtp.*`.

The head is loaded instead (strictly: every one of its tensors, by name and shape) when
config.json says mtp_num_hidden_layers >= 1 and the checkpoint has `mtp.*` tensors: it becomes
the draft function of `export --verify K` (ssmport.models.qwen3_5.mtp; its names and the
config key: mtp_checkpoint). Its canonical names are
the checkpoint's (`mtp.fc.weight`, `mtp.layers.0.self_attn.q_proj.weight`, ...); the manifest
still lists it as skipped unless the bundle carries that function."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.layers.attention import AttentionNames, attention_shapes
from ssmport.models.loading import check_layer_count, checked_view, head_name
from ssmport.models.qwen3_5.config import FULL, Qwen35Config, from_hf
from ssmport.models.qwen3_5.mtp_checkpoint import MTP_PREFIX, decoder_layer_shapes, layer_attention, mtp_shapes, with_mtp

EMBED, HEAD, NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"
VLM_PREFIX = "model.language_model."
# Tensors of the released packaging that the language model does not use: prefix -> what.
SKIPPED = {"model.visual.": "vision tower", MTP_PREFIX: "multi-token prediction head"}


def layer(i: int) -> str:
    return f"model.layers.{i}."


def attention(cfg: Qwen35Config, i: int, prefix: str | None = None) -> AttentionNames:
    """Layer i's attention names (`prefix`: another layer's, the MTP layer's)."""
    return layer_attention(cfg, prefix or layer(i))


def canonical_shapes(cfg: Qwen35Config) -> dict[str, tuple[int, ...]]:
    C, V, d = cfg.hidden_size, cfg.vocab_size, cfg.delta_rule
    shapes: dict[str, tuple[int, ...]] = {EMBED: (V, C)}
    for i, kind in enumerate(cfg.layer_types):
        p = layer(i)
        shapes |= decoder_layer_shapes(cfg, p)
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
    cfg = with_mtp(cfg, cj, source)
    shapes = canonical_shapes(cfg)
    renamed = {n: to_source(n) for n in shapes} | {HEAD: head_name(cfg.tie_word_embeddings, source, HEAD, to_source(EMBED))}
    skipped = {n: source.shape(n) for n in source if n.startswith(tuple(SKIPPED)) and n not in shapes}
    packaging = "Qwen3_5ForConditionalGeneration layout" if prefix == VLM_PREFIX else "Qwen3_5ForCausalLM layout"
    # the head stays listed as skipped (the manifest's record) until an export uses it
    counts = {p: sum(n.startswith(p) for n in source if n.startswith(tuple(SKIPPED))) for p in SKIPPED}
    return cfg, checked_view(source, shapes, renamed, None, f"Qwen3.5 {cfg.describe()} ({packaging})", optional=skipped,
                             skipped={p: (SKIPPED[p], k) for p, k in counts.items() if k})  # fmt: skip

