"""OLMo-Hybrid (transformers `OlmoHybridForCausalLM`, allenai Olmo-Hybrid-7B): Gated DeltaNet
layers (beta in (0, 2), q/k/v short convs) and OLMo-style full-attention layers with a KV
cache; the architecture object."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ssmport.loader.checkpoint import TensorSource
from ssmport.errors import CheckpointError
from ssmport.models.hybrid import HybridArchitecture, delta_rule_hybrid_specs
from ssmport.models.olmo_hybrid import block, checkpoints, quant, synthetic
from ssmport.models.olmo_hybrid.config import PRESETS, OlmoHybridConfig
from ssmport.models.olmo_hybrid.reference import OlmoHybridReference
from ssmport.models.package import package_parts
from ssmport.state import StateSpec


@dataclass
class _OlmoHybrid(HybridArchitecture):  # the hybrids' context and apple layout, the delta-rule hybrids' states
    def load_pth(self, source: TensorSource):
        raise CheckpointError(f"{source.origin}: OLMo-Hybrid weights load from a Hugging Face folder (config.json + "
                              "safetensors), not a bare .pth")  # fmt: skip

    def state_specs(self, config: OlmoHybridConfig, state_dtype: torch.dtype) -> list[StateSpec]:
        return delta_rule_hybrid_specs(config, state_dtype)


OLMO_HYBRID = _OlmoHybrid(
    name="olmo_hybrid",
    description="OLMo-Hybrid: Gated DeltaNet (beta in (0, 2)) + OLMo full attention with a KV cache, 4 states as Apple's hybrids",
    hf_architectures=("OlmoHybridForCausalLM",),
    presets=PRESETS,
    tiny_preset="olmo-hybrid-tiny",
    preset_keys=("vocab_size", "hidden_size", "intermediate_size", "layer_types", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                 "linear_key_head_dim", "linear_value_head_dim"),
    loader=checkpoints.load_hf,
    **package_parts(OlmoHybridConfig, OlmoHybridReference, checkpoints, synthetic, block, quant),
)
