"""LFM2-MoE (Liquid AI: LFM2-8B-A1B): LFM2's gated short convs and GQA attention, routed experts
in the MLPs past the first dense layers. The architecture object."""

from __future__ import annotations

from ssmport.models.hybrid import HybridArchitecture
from ssmport.models.lfm2_moe import block, checkpoints, quant, synthetic
from ssmport.models.lfm2_moe.config import PRESETS, Lfm2MoeConfig
from ssmport.models.lfm2_moe.reference import Lfm2MoeReference
from ssmport.models.package import package_parts

LFM2_MOE = HybridArchitecture(
    name="lfm2_moe",
    description="LFM2-MoE (Liquid AI): LFM2's convs + attention, routed experts (top-k of sigmoid scores)",
    hf_architectures=("Lfm2MoeForCausalLM",),
    presets=PRESETS,
    tiny_preset="lfm2-moe-tiny",
    preset_keys=("vocab_size", "hidden_size", "intermediate_size", "layer_types", "num_heads", "num_kv_heads", "head_dim",
                 "num_dense_layers", "num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    loader=checkpoints.load,
    **package_parts(Lfm2MoeConfig, Lfm2MoeReference, checkpoints, synthetic, block, quant),
)
