"""LFM2 / LFM2.5 (Liquid AI): gated short convs and GQA attention. The architecture object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ssmport.models.hybrid import HybridArchitecture
from ssmport.models.lfm2 import block, checkpoints, quant, synthetic
from ssmport.models.lfm2.config import PRESETS, Lfm2Config
from ssmport.models.lfm2.reference import Lfm2Reference
from ssmport.models.package import package_parts

# Liquid AI's other model types: claimed here so that the loader refuses them by name (what is
# not supported) rather than as an unknown model_type.
REFUSED_MODEL_TYPES = ("lfm2_moe", "lfm2_vl")


@dataclass
class _Lfm2(HybridArchitecture):
    def matches_hf_config(self, config_json: Mapping[str, Any]) -> bool:
        return super().matches_hf_config(config_json) or config_json.get("model_type") in REFUSED_MODEL_TYPES


LFM2 = _Lfm2(
    name="lfm2",
    description="LFM2 / LFM2.5 (Liquid AI): gated short convs + GQA attention with a KV cache",
    hf_architectures=("Lfm2ForCausalLM",),
    presets=PRESETS,
    tiny_preset="lfm2-tiny",
    loader=checkpoints.load,
    **package_parts(Lfm2Config, Lfm2Reference, checkpoints, synthetic, block, quant),
)
