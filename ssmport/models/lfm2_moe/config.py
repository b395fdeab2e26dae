"""LFM2-MoE config (transformers' Lfm2MoeConfig keys): LFM2's layers, SwiGLU MLPs in the first
`num_dense_layers` layers and routed experts (sigmoid scores, expert bias) after them; presets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ssmport.architectures.base import HubSource, Preset
from ssmport.errors import CheckpointError
from ssmport.models.hybrid import ATTENTION, CONV
from ssmport.models.lfm2.config import Lfm2Config, common_fields
from ssmport.models.loading import ConfigReader, MAX_LAYERS
from ssmport.models.moe import SIGMOID, MoeSpec

# Lfm2MoeTopKRouter divides the chosen weights by their sum + 1e-6 (a constant in transformers).
NORM_TOPK_EPS = 1e-6


@dataclass(frozen=True)
class Lfm2MoeConfig(Lfm2Config):
    num_dense_layers: int = 2  # layers 0..n-1 keep a dense SwiGLU of intermediate_size
    num_experts: int = 32
    num_experts_per_tok: int = 4
    moe_intermediate_size: int = 1792
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    use_expert_bias: bool = True

    @property
    def moe(self) -> MoeSpec:
        return MoeSpec(self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size, SIGMOID,
                       self.norm_topk_prob, NORM_TOPK_EPS, self.routed_scaling_factor, self.use_expert_bias)  # fmt: skip

    def is_moe(self, i: int) -> bool:
        return i >= self.num_dense_layers

    def validate(self) -> None:
        super().validate()
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise CheckpointError(f"LFM2-MoE: num_experts_per_tok {self.num_experts_per_tok} is not in [1, num_experts={self.num_experts}]")
        if self.num_dense_layers > self.num_layers:
            raise CheckpointError(f"LFM2-MoE: num_dense_layers {self.num_dense_layers} > {self.num_layers} layers")

    def describe(self) -> str:
        return super().describe()[:-1] + f", {self.num_dense_layers} dense, then {self.moe.describe()})"


def from_transformers(cj: Mapping[str, Any], origin: str) -> tuple[Lfm2MoeConfig, bool]:
    """(config, tied) from an Lfm2MoeConfig config.json; missing keys take transformers' defaults."""
    r = ConfigReader(cj, origin, "LFM2-MoE")
    fields, tied = common_fields(r, cj)
    moe = dict(
        intermediate_size=r.int("intermediate_size", 7168), num_dense_layers=r.int("num_dense_layers", 2, lo=0, hi=MAX_LAYERS),
        num_experts=r.int("num_experts", 32, hi=4096), num_experts_per_tok=r.int("num_experts_per_tok", 4, hi=4096),
        moe_intermediate_size=r.int("moe_intermediate_size", 1792), norm_topk_prob=r.bool("norm_topk_prob", True),
        routed_scaling_factor=r.float("routed_scaling_factor", 1.0, positive=True), use_expert_bias=r.bool("use_expert_bias", True),
    )  # fmt: skip
    return Lfm2MoeConfig(**fields, **moe), tied


# LFM2-8B-A1B (model card: 24 layers, 18 conv + 6 GQA attention, 32 experts top-4, 8.3B total /
# 1.5B active; transformers' Lfm2MoeConfig defaults are this model's). Which layers attend is
# not confirmed here (no Hub access): the split below gives the card's counts and parameter total.
_ATTN_24 = (2, 6, 10, 14, 18, 21)


PRESETS = (
    Preset("lfm2-8b-a1b", "lfm2_moe",
           {"vocab_size": 65536, "hidden_size": 2048, "num_heads": 32, "num_kv_heads": 8, "head_dim": 64,
            "layer_types": [ATTENTION if i in _ATTN_24 else CONV for i in range(24)], "intermediate_size": 7168,
            "num_dense_layers": 2, "num_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 1792,
            "max_position_embeddings": 128000},
           "LiquidAI LFM2-8B-A1B (24 layers: 18 conv + 6 attention, H2048, 2 dense + 22 MoE layers of 4 of 32 "
           "experts x 1792; attention layer positions unconfirmed)", True,
           HubSource("LiquidAI/LFM2-8B-A1B", confirmed="model card counts + transformers' Lfm2MoeConfig defaults")),
    Preset("lfm2-moe-tiny", "lfm2_moe",
           {"vocab_size": 512, "hidden_size": 128, "layer_types": [CONV, CONV, ATTENTION, CONV, ATTENTION],
            "num_heads": 4, "num_kv_heads": 2, "head_dim": 32, "intermediate_size": 192, "num_dense_layers": 1,
            "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "context": 64},
           "A tiny random LFM2-MoE for tests (1 dense + 4 MoE layers, 2 of 8 experts)", False),
)
