"""Qwen3.5 (transformers `Qwen3_5ForCausalLM` / `Qwen3_5ForConditionalGeneration`): Gated
DeltaNet layers and gated full-attention layers with a KV cache; the architecture object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.loader.checkpoint import TensorSource
from ssmport.errors import CheckpointError
from ssmport.models.hybrid import HybridArchitecture, delta_rule_hybrid_specs
from ssmport.models.package import package_parts
from ssmport.models.qwen3_5 import block, checkpoints, quant, synthetic
from ssmport.models.qwen3_5.config import PRESETS, Qwen35Config
from ssmport.models.qwen3_5.mtp_checkpoint import MTP_PREFIX
from ssmport.models.qwen3_5.reference import Qwen35Reference
from ssmport.state import StateSpec

TEXT_TYPES = ("qwen3_5", "qwen3_5_text")
# Same family, other MLPs: refused by name, with what ssmport lacks for them (Qwen3.5-MoE is
# its own package, ssmport.models.qwen3_5_moe).
REFUSED_TYPES = {
    "qwen3_next": "Qwen3-Next (routed experts, and a fused in_proj_qkvz with a per-group layout)",
}


@dataclass
class Qwen35Architecture(HybridArchitecture):  # the hybrids' context and apple layout, its own loader and states
    def matches_hf_config(self, config_json: Mapping[str, Any]) -> bool:
        return config_json.get("model_type") in (*TEXT_TYPES, *REFUSED_TYPES) or super().matches_hf_config(config_json)

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        kind = config_json.get("model_type")
        if kind in REFUSED_TYPES:
            raise CheckpointError(f"{source.origin}: {REFUSED_TYPES[kind]} is not supported: ssmport exports the dense "
                                  "Qwen3.5 sizes only (no mixture-of-experts MLP)")  # fmt: skip
        return checkpoints.load_hf(config_json, source)

    def load_pth(self, source: TensorSource):
        raise CheckpointError(f"{source.origin}: Qwen3.5 weights load from a Hugging Face folder (config.json + "
                              "safetensors), not a bare .pth")  # fmt: skip

    def state_specs(self, config: Qwen35Config, state_dtype: torch.dtype) -> list[StateSpec]:
        return delta_rule_hybrid_specs(config, state_dtype)

    draft_tensors = MTP_PREFIX + "*"  # the head's group, skipped unless exported

    def build_draft(self, config, weights, builder, decode, rows, state_dtype):
        from ssmport.models.qwen3_5.mtp import build_draft

        return build_draft(config, weights, builder, decode, rows, state_dtype)


QWEN3_5 = Qwen35Architecture(
    name="qwen3_5",
    description="Qwen3.5 (dense): Gated DeltaNet + gated full attention with a KV cache, 4 states as Apple exports them",
    hf_architectures=("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
    presets=PRESETS,
    tiny_preset="qwen3.5-tiny",
    preset_keys=("vocab_size", "hidden_size", "intermediate_size", "layer_types", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                 "linear_key_head_dim", "linear_value_head_dim"),
    **package_parts(Qwen35Config, Qwen35Reference, checkpoints, synthetic, block, quant),
)
