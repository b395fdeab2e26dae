"""Qwen3.5-MoE (transformers `Qwen3_5MoeForCausalLM` / `Qwen3_5MoeForConditionalGeneration`:
Qwen3.5-35B-A3B, Qwen3.6-35B-A3B): Qwen3.5's layers and states, routed experts and a gated
shared expert in every MLP; the architecture object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.package import package_parts
from ssmport.models.qwen3_5 import QWEN3_5, Qwen35Architecture
from ssmport.models.qwen3_5_moe import block, checkpoints, quant, synthetic
from ssmport.models.qwen3_5_moe.config import PRESETS, Qwen35MoeConfig
from ssmport.models.qwen3_5_moe.reference import Qwen35MoeReference

MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text")


@dataclass
class _Qwen35Moe(Qwen35Architecture):  # Qwen3.5's states and context; its own loader
    def matches_hf_config(self, config_json: Mapping[str, Any]) -> bool:
        hf_arch = set(config_json.get("architectures") or [])
        return config_json.get("model_type") in MODEL_TYPES or bool(hf_arch & set(self.hf_architectures))

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        return checkpoints.load_hf(config_json, source)


QWEN3_5_MOE = _Qwen35Moe(
    name="qwen3_5_moe",
    description="Qwen3.5-MoE: Qwen3.5's Gated DeltaNet + gated attention, routed experts (softmax top-k) + gated shared expert",
    hf_architectures=("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration"),
    presets=PRESETS,
    tiny_preset="qwen3.5-moe-tiny",
    preset_keys=(*QWEN3_5.preset_keys, "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                 "shared_expert_intermediate_size"),
    **package_parts(Qwen35MoeConfig, Qwen35MoeReference, checkpoints, synthetic, block, quant),
)
