"""Qwen3.5 weights. Canonical names are transformers' text-only names (`Qwen3_5ForCausalLM`:
`model.*`, `lm_head.weight`), nn.Linear [out, in], conv [D, 1, K].

Released folders are `Qwen3_5ForConditionalGeneration`: the language model under
`model.language_model.*`, and two groups of tensors that are not part of it, which are left
out by prefix (and said so in the manifest and in one line of output), never by a loose load:
the vision tower `model.visual.*` and the multi-token-prediction head `mtp.*`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.checkpoint import MappedSource, TensorSource, check_strict
from ssmport.models.loading import as_f32, check_layer_count, head_name
from ssmport.models.qwen3_5.config import FULL, Qwen35Config, from_hf

EMBED, HEAD, NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"
VLM_PREFIX = "model.language_model."
# Tensors of the released packaging that the language model does not use: prefix -> what.
SKIPPED = {"model.visual.": "vision tower", "mtp.": "multi-token prediction head"}


def layer(i: int) -> str:
    return f"model.layers.{i}."


def canonical_shapes(cfg: Qwen35Config) -> dict[str, tuple[int, ...]]:
    C, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {EMBED: (V, C)}
    for i, kind in enumerate(cfg.layer_types):
        p = layer(i)
        shapes |= {p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                   p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C), p + "mlp.down_proj.weight": (C, F)}
        if kind == FULL:
            a, q, kv, hd = p + "self_attn.", cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, cfg.head_dim
            shapes |= {a + "q_proj.weight": (2 * q, C), a + "k_proj.weight": (kv, C), a + "v_proj.weight": (kv, C),
                       a + "o_proj.weight": (C, q), a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,)}
            if cfg.attention_bias:
                shapes |= {a + "q_proj.bias": (2 * q,), a + "k_proj.bias": (kv,), a + "v_proj.bias": (kv,), a + "o_proj.bias": (C,)}
        else:
            a, HV = p + "linear_attn.", cfg.linear_num_value_heads
            shapes |= {a + "in_proj_qkv.weight": (cfg.conv_dim, C), a + "in_proj_z.weight": (cfg.value_dim, C),
                       a + "in_proj_b.weight": (HV, C), a + "in_proj_a.weight": (HV, C),
                       a + "conv1d.weight": (cfg.conv_dim, 1, cfg.linear_conv_kernel_dim), a + "dt_bias": (HV,),
                       a + "A_log": (HV,), a + "norm.weight": (cfg.linear_value_head_dim,), a + "out_proj.weight": (C, cfg.value_dim)}  # fmt: skip
    return shapes | {NORM: (C,), HEAD: (V, C)}


def load_hf(cj: Mapping[str, Any], source: TensorSource) -> tuple[Qwen35Config, TensorSource]:
    """A `Qwen3_5ForCausalLM` folder (`model.*`) or the released `Qwen3_5ForConditionalGeneration`
    packaging (`model.language_model.*`, plus the skipped groups)."""
    cfg = from_hf(cj, source.origin)
    prefix = VLM_PREFIX if any(n.startswith(VLM_PREFIX) for n in source) else "model."
    to_source = lambda name: prefix + name.removeprefix("model.") if name.startswith("model.") else name  # noqa: E731
    check_layer_count(cfg.num_layers, source, prefix + "layers.", source.origin)
    shapes = canonical_shapes(cfg)
    head = head_name(cfg.tie_word_embeddings, source, HEAD, to_source(EMBED))
    expected = {to_source(n): s for n, s in shapes.items() if not (head != HEAD and n == HEAD)}
    skipped = {n: source.shape(n) for n in source if n.startswith(tuple(SKIPPED))}
    packaging = "Qwen3_5ForConditionalGeneration layout" if prefix == VLM_PREFIX else "Qwen3_5ForCausalLM layout"
    check_strict(source, expected | skipped, frozenset(skipped), what=f"Qwen3.5 {cfg.describe()} ({packaging})")
    mapping = {n: (to_source(n), as_f32) for n in shapes} | {HEAD: (head, as_f32)}
    counts = {p: sum(n.startswith(p) for n in skipped) for p in SKIPPED}
    return cfg, MappedSource(source, mapping, shapes, skipped={p: (SKIPPED[p], k) for p, k in counts.items() if k})
