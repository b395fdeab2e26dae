"""Nemotron-H (NVIDIA, dense releases): Mamba-2, attention and MLP layers in the order of
`hybrid_override_pattern`. The architecture object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.checkpoint import TensorSource
from ssmport.models.hybrid import conv_spec, kv_specs, recurrent_spec
from ssmport.models.nemotron_h import block, checkpoints, quant, synthetic
from ssmport.models.nemotron_h.config import PRESETS, NemotronHConfig
from ssmport.models.nemotron_h.reference import NemotronHReference
from ssmport.models.package import PackagedArchitecture, package_parts
from ssmport.state import StateSpec


@dataclass
class _NemotronH(PackagedArchitecture):
    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        return checkpoints.load(config_json, source)

    def state_specs(self, config: NemotronHConfig, state_dtype: torch.dtype) -> list[StateSpec]:
        c, specs = config, []
        if c.attention_layers:
            specs += kv_specs(c.attention_layers, c.num_kv_heads, c.context, c.head_dim, state_dtype)
        if c.mamba_layers:
            specs += [conv_spec(c.mamba_layers, c.conv_kernel, c.mixer.conv_dim, state_dtype, "x | B | C"),
                      recurrent_spec(c.mamba_layers, c.mixer, state_dtype)]  # fmt: skip
        return specs


NEMOTRON_H = _NemotronH(
    name="nemotron_h",
    description="Nemotron-H (NVIDIA, dense): Mamba-2, attention and relu^2 MLP layers in a pattern",
    hf_architectures=("NemotronHForCausalLM",),
    presets=PRESETS,
    tiny_preset="nemotron-h-tiny",
    **package_parts(NemotronHConfig, NemotronHReference, checkpoints, synthetic, block, quant),
)
