"""LFM2 / LFM2.5 (Liquid AI): gated short convs and GQA attention. The architecture object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.checkpoint import TensorSource
from ssmport.models.hybrid import conv_spec, kv_specs
from ssmport.models.lfm2 import block, checkpoints, quant, synthetic
from ssmport.models.lfm2.config import PRESETS, Lfm2Config
from ssmport.models.lfm2.reference import Lfm2Reference
from ssmport.models.package import PackagedArchitecture, package_parts
from ssmport.state import StateSpec

# Liquid AI's other model types: claimed here so that they are refused by name (the loader
# says what is not supported) rather than reported as unknown.
REFUSED_MODEL_TYPES = ("lfm2_moe", "lfm2_vl")


@dataclass
class _Lfm2(PackagedArchitecture):
    def matches_hf_config(self, config_json: Mapping[str, Any]) -> bool:
        return super().matches_hf_config(config_json) or config_json.get("model_type") in REFUSED_MODEL_TYPES

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        return checkpoints.load(config_json, source)

    def state_specs(self, config: Lfm2Config, state_dtype: torch.dtype) -> list[StateSpec]:
        c, specs = config, []
        if c.attention_layers:
            specs += kv_specs(c.attention_layers, c.num_kv_heads, c.context, c.head_dim, state_dtype)
        if c.conv_layers:
            specs.append(conv_spec(c.conv_layers, c.conv_kernel, c.hidden_size, state_dtype, "B*x"))
        return specs


LFM2 = _Lfm2(
    name="lfm2",
    description="LFM2 / LFM2.5 (Liquid AI): gated short convs + GQA attention with a KV cache",
    hf_architectures=("Lfm2ForCausalLM",),
    presets=PRESETS,
    tiny_preset="lfm2-tiny",
    **package_parts(Lfm2Config, Lfm2Reference, checkpoints, synthetic, block, quant),
)
