"""LFM2-MoE weights: LFM2's names (ssmport.models.lfm2.checkpoints), and past the dense layers
the router `feed_forward.gate.weight` [E, C], `feed_forward.expert_bias` [E] and per expert
`feed_forward.experts.N.{w1,w3,w2}.weight` (canonical: one tensor per expert, as released).

Two layouts are read, each strictly: the released one (what transformers' save_pretrained
writes back), and transformers' fused in-memory one (`experts.gate_up_proj` [E, 2F, C], gate
rows first, and `experts.down_proj` [E, C, F]), chosen per layer by which names are present."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.lfm2.checkpoints import CONV_WEIGHT, EMBEDDING, HEAD, dense_mlp_shapes, layer
from ssmport.models.lfm2.checkpoints import canonical_shapes as lfm2_shapes
from ssmport.models.lfm2_moe.config import Lfm2MoeConfig, from_transformers
from ssmport.models.loading import AS_IS, DEPTHWISE_CONV, check_layer_count, head_name, storage_view
from ssmport.models.moe import MoeNames, fused_expert_storage, moe_shapes


def moe_names(i: int) -> MoeNames:
    f = layer(i) + "feed_forward."
    return MoeNames(f + "gate.weight", tuple(f + f"experts.{{e}}.{w}.weight" for w in ("w1", "w3", "w2")),
                    bias=f + "expert_bias")  # fmt: skip


def mlp_shapes(cfg: Lfm2MoeConfig, i: int) -> dict[str, tuple[int, ...]]:
    return moe_shapes(cfg.moe, moe_names(i), cfg.hidden_size) if cfg.is_moe(i) else dense_mlp_shapes(cfg, i)


def canonical_shapes(cfg: Lfm2MoeConfig) -> dict[str, tuple[int, ...]]:
    return lfm2_shapes(cfg, mlp_shapes)


def load(cj: Mapping[str, Any], source: TensorSource) -> tuple[Lfm2MoeConfig, TensorSource]:
    """An `Lfm2MoeForCausalLM` folder, per-expert or fused experts."""
    cfg, tied = from_transformers(cj, source.origin)
    cfg.validate()
    check_layer_count(cfg.num_layers, source, "model.layers.", source.origin)
    shapes = canonical_shapes(cfg)
    storage = {n: (n, DEPTHWISE_CONV if n.endswith(CONV_WEIGHT) else AS_IS) for n in shapes}
    storage[HEAD] = (head_name(tied, source, HEAD, EMBEDDING), AS_IS)
    for i in range(cfg.num_dense_layers, cfg.num_layers):
        storage |= fused_expert_storage(cfg.moe, moe_names(i), layer(i) + "feed_forward.experts.", source)
    return cfg, storage_view(source, shapes, storage, f"LFM2-MoE {cfg.describe()}")
