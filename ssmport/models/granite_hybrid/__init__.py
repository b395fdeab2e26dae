"""Granite-4.0-H (IBM, `granitemoehybrid`, dense releases): Mamba-2 and attention layers, each
with the shared MLP. The architecture object."""

from __future__ import annotations

from ssmport.models.granite_hybrid import block, checkpoints, quant, synthetic
from ssmport.models.granite_hybrid.config import PRESETS, GraniteHybridConfig
from ssmport.models.granite_hybrid.reference import GraniteHybridReference
from ssmport.models.hybrid import HybridArchitecture
from ssmport.models.package import package_parts

GRANITE_HYBRID = HybridArchitecture(
    name="granitemoehybrid",
    description="Granite-4.0-H (IBM, dense): Mamba-2 + attention without positions, the shared MLP, four multipliers",
    hf_architectures=("GraniteMoeHybridForCausalLM",),
    presets=PRESETS,
    tiny_preset="granite-hybrid-tiny",
    preset_keys=("vocab_size", "hidden_size", "intermediate_size", "layer_types", "num_heads", "num_kv_heads",
                 "head_dim", "mamba_heads", "mamba_head_dim", "state_size", "n_groups"),
    loader=checkpoints.load,
    **package_parts(GraniteHybridConfig, GraniteHybridReference, checkpoints, synthetic, block, quant),
)
