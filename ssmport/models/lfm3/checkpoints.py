"""LFM3 weights: transformers' names as save_pretrained writes them (`model.*`, nn.Linear
[out, in]; the per-head gate is `self_attn.gate_proj`, transformers' module `g_proj`), the
short conv squeezed to [H, K], the head always present (a tied folder's is its embedding).
LFM2's conv, MLP and norm names; the sandwich norms `post_{operator,ffn}_norm`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.layers.attention import AttentionNames, attention_names, attention_shapes
from ssmport.models.lfm2.checkpoints import canonical_shapes as lfm2_shapes
from ssmport.models.lfm2.checkpoints import layer
from ssmport.models.lfm2.checkpoints import load as lfm2_load
from ssmport.models.lfm3.config import Lfm3Config, from_transformers

POST_NORMS = ("post_operator_norm.weight", "post_ffn_norm.weight")


def attention(cfg: Lfm3Config, i: int) -> AttentionNames:
    return attention_names(layer(i) + "self_attn.", norm="norm", bias=cfg.attention_bias,
                           gate="gate_proj" if cfg.attention_gate else None)  # fmt: skip


def attention_shapes_of(cfg: Lfm3Config, i: int) -> dict[str, tuple[int, ...]]:
    return attention_shapes(cfg.attention_of(cfg.layer_types[i]), attention(cfg, i), cfg.hidden_size)


def canonical_shapes(cfg: Lfm3Config) -> dict[str, tuple[int, ...]]:
    shapes = lfm2_shapes(cfg, attn=attention_shapes_of)
    if cfg.sandwich_norm:
        shapes |= {layer(i) + n: (cfg.hidden_size,) for i in range(cfg.num_layers) for n in POST_NORMS}
    return shapes


def load(cj: Mapping[str, Any], source: TensorSource) -> tuple[Lfm3Config, TensorSource]:
    """An `Lfm3ForCausalLM` folder."""
    return lfm2_load(cj, source, from_transformers, canonical_shapes, "LFM3")
