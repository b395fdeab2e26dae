"""Mamba-1 (the selective scan) and Falcon-Mamba (the same layer with weightless RMS norms on
dt, B and C: `Mamba1Config.bcdt_norm_eps`): the architecture object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.mamba1 import block, checkpoints, quant, synthetic
from ssmport.models.mamba1.config import PRESETS, Mamba1Config, is_mamba_ssm
from ssmport.models.mamba1.reference import Mamba1Reference
from ssmport.models.package import PackagedArchitecture, package_parts
from ssmport.state import StateSpec

MODEL_TYPES = ("mamba", "falcon_mamba")  # transformers' names for the two


@dataclass
class _Mamba1(PackagedArchitecture):
    def matches_hf_config(self, config_json: Mapping[str, Any]) -> bool:
        return super().matches_hf_config(config_json) or config_json.get("model_type") in MODEL_TYPES or is_mamba_ssm(config_json)

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        return checkpoints.load(config_json, source)

    def state_specs(self, config: Mamba1Config, state_dtype: torch.dtype) -> list[StateSpec]:
        c = config
        return [
            StateSpec(block.CONV_STATE, (c.num_layers, 1, c.conv_kernel, c.intermediate_size), state_dtype,
                      "[layer, batch, time: last K conv inputs, oldest first, channel]"),
            StateSpec(block.SSM_STATE, (c.num_layers, 1, c.intermediate_size, c.state_size), state_dtype,
                      "[layer, batch, channel, state]"),
        ]  # fmt: skip


MAMBA1 = _Mamba1(
    name="mamba1",
    description="Mamba-1 / Falcon-Mamba (selective scan): conv + SSM states, transformers or mamba_ssm folders",
    hf_architectures=("MambaForCausalLM", "MambaModel", "FalconMambaForCausalLM", "FalconMambaModel"),
    presets=PRESETS,
    tiny_preset="mamba1-tiny",
    preset_keys=("vocab_size", "hidden_size", "num_layers", "intermediate_size", "dt_rank", "state_size", "conv_kernel",
                 "bcdt_norm_eps"),
    **package_parts(Mamba1Config, Mamba1Reference, checkpoints, synthetic, block, quant),
)
