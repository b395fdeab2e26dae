"""Granite-4.0-H (IBM, `granitemoehybrid`): Mamba-2 and attention layers, each with the shared
MLP and, in the MoE releases (Tiny, Small), routed experts. The architecture object."""

from __future__ import annotations

from ssmport.models.granite_hybrid import block, checkpoints, quant, synthetic
from ssmport.models.granite_hybrid.config import PRESETS, GraniteHybridConfig
from ssmport.models.granite_hybrid.reference import GraniteHybridReference
from ssmport.models.hybrid import HybridArchitecture
from ssmport.models.package import package_parts

GRANITE_HYBRID = HybridArchitecture(
    name="granitemoehybrid",
    description="Granite-4.0-H (IBM): Mamba-2 + attention without positions, the shared MLP (+ routed experts), four multipliers",
    hf_architectures=("GraniteMoeHybridForCausalLM",),
    presets=PRESETS,
    tiny_preset="granite-hybrid-tiny",
    preset_keys=("vocab_size", "hidden_size", "intermediate_size", "layer_types", "num_heads", "num_kv_heads",
                 "head_dim", "mamba_heads", "mamba_head_dim", "state_size", "n_groups", "num_local_experts",
                 "num_experts_per_tok", "moe_intermediate_size"),
    loader=checkpoints.load,
    **package_parts(GraniteHybridConfig, GraniteHybridReference, checkpoints, synthetic, block, quant),
)
