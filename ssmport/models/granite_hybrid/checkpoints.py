"""Granite-4.0-H weights: canonical names are transformers' (`model.*`, nn.Linear [out, in]),
the Mamba-2 conv squeezed to [C, K], the head always present (a tied folder's is its embedding).

The MoE releases keep each layer's experts stacked, as released and as save_pretrained writes
them: `block_sparse_moe.input_linear.weight` [E, 2F, C] (gate rows, then up rows),
`block_sparse_moe.output_linear.weight` [E, C, F] and the router `block_sparse_moe.router.layer
.weight` [E, C]. Canonically each expert's gate / up / down is one tensor
(`block_sparse_moe.input_linear.N.{gate,up}`, `block_sparse_moe.output_linear.N`), read as rows
of those stacks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.granite_hybrid.config import MAMBA, GraniteHybridConfig, from_transformers
from ssmport.models.layers.attention import AttentionNames, attention_names, attention_shapes
from ssmport.models.loading import AS_IS, DEPTHWISE_CONV, check_layer_count, head_name, storage_view
from ssmport.models.mamba2.checkpoints import mixer_shapes
from ssmport.models.moe import MoeNames, fused_expert_storage, moe_shapes

EMBEDDING, HEAD, FINAL_NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"


def layer(i: int) -> str:
    return f"model.layers.{i}."


def attention(cfg: GraniteHybridConfig, i: int) -> AttentionNames:
    return attention_names(layer(i) + "self_attn.", bias=cfg.attention_bias)


def moe_names(i: int) -> MoeNames:
    m = layer(i) + "block_sparse_moe."
    return MoeNames(m + "router.layer.weight", (m + "input_linear.{e}.gate", m + "input_linear.{e}.up", m + "output_linear.{e}"))


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
        if cfg.num_local_experts:
            shapes |= moe_shapes(cfg.moe, moe_names(i), H)
    return shapes | {FINAL_NORM: (H,), HEAD: (V, H)}


def load(cj: Mapping[str, Any], source: TensorSource) -> tuple[GraniteHybridConfig, TensorSource]:
    """A `GraniteMoeHybridForCausalLM` folder, dense or with experts."""
    cfg, tied = from_transformers(cj, source.origin)
    cfg.validate()
    check_layer_count(cfg.num_layers, source, "model.layers.", source.origin)
    shapes = canonical_shapes(cfg)
    storage = {n: (n, DEPTHWISE_CONV if n.endswith("conv1d.weight") else AS_IS) for n in shapes}
    storage[HEAD] = (head_name(tied, source, HEAD, EMBEDDING), AS_IS)
    for i in range(cfg.num_layers if cfg.num_local_experts else 0):
        storage |= fused_expert_storage(cfg.moe, moe_names(i), layer(i) + "block_sparse_moe.", source,
                                      fused="input_linear.weight", down="output_linear.weight", always=True)  # fmt: skip
    return cfg, storage_view(source, shapes, storage, f"Granite-4.0-H {cfg.describe()}")
