"""Granite-4.0-H (IBM, `granitemoehybrid`, dense releases): Mamba-2 and attention layers, each
with the shared MLP. The architecture object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.checkpoint import TensorSource
from ssmport.models.granite_hybrid import block, checkpoints, quant, synthetic
from ssmport.models.granite_hybrid.config import PRESETS, GraniteHybridConfig
from ssmport.models.granite_hybrid.reference import GraniteHybridReference
from ssmport.models.hybrid import conv_spec, kv_specs, recurrent_spec
from ssmport.models.package import PackagedArchitecture, package_parts
from ssmport.state import StateSpec


@dataclass
class _GraniteHybrid(PackagedArchitecture):
    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        return checkpoints.load(config_json, source)

    def state_specs(self, config: GraniteHybridConfig, state_dtype: torch.dtype) -> list[StateSpec]:
        c, specs = config, []
        if c.attention_layers:
            specs += kv_specs(c.attention_layers, c.num_kv_heads, c.context, c.head_dim, state_dtype)
        if c.mamba_layers:
            specs += [conv_spec(c.mamba_layers, c.conv_kernel, c.mixer.conv_dim, state_dtype, "x | B | C"),
                      recurrent_spec(c.mamba_layers, c.mixer, state_dtype)]  # fmt: skip
        return specs


GRANITE_HYBRID = _GraniteHybrid(
    name="granitemoehybrid",
    description="Granite-4.0-H (IBM, dense): Mamba-2 + attention without positions, the shared MLP, four multipliers",
    hf_architectures=("GraniteMoeHybridForCausalLM",),
    presets=PRESETS,
    tiny_preset="granite-hybrid-tiny",
    **package_parts(GraniteHybridConfig, GraniteHybridReference, checkpoints, synthetic, block, quant),
)
