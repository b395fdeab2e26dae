"""Nemotron-H (NVIDIA: the dense releases and Nemotron-3's MoE ones): Mamba-2, attention, MLP
and MoE layers in the order of `hybrid_override_pattern`. The architecture object."""

from __future__ import annotations

from ssmport.models.hybrid import HybridArchitecture
from ssmport.models.nemotron_h import block, checkpoints, quant, synthetic
from ssmport.models.nemotron_h.config import PRESETS, NemotronHConfig
from ssmport.models.nemotron_h.reference import NemotronHReference
from ssmport.models.package import package_parts

NEMOTRON_H = HybridArchitecture(
    name="nemotron_h",
    description="Nemotron-H (NVIDIA): Mamba-2, attention, relu^2 MLP and MoE layers in a pattern (Nemotron-3 Nano)",
    hf_architectures=("NemotronHForCausalLM",),
    presets=PRESETS,
    tiny_preset="nemotron-h-tiny",
    preset_keys=("vocab_size", "hidden_size", "intermediate_size", "pattern", "num_heads", "num_kv_heads", "head_dim",
                 "mamba_heads", "mamba_head_dim", "state_size", "n_groups", "n_routed_experts", "num_experts_per_tok",
                 "moe_intermediate_size", "moe_shared_expert_intermediate_size", "n_group", "topk_group"),
    loader=checkpoints.load,
    **package_parts(NemotronHConfig, NemotronHReference, checkpoints, synthetic, block, quant),
)
