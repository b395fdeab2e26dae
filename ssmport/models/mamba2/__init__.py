"""Mamba-2 (SSD): the architecture object (its parts are this package's modules)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.state import StatePart, StateSplit
from ssmport.loader.checkpoint import TensorSource
from ssmport.models.mamba2 import block, checkpoints, quant, synthetic
from ssmport.models.mamba2.config import PRESETS, Mamba2Config, is_mamba_ssm
from ssmport.models.mamba2.reference import Mamba2Reference
from ssmport.models.package import PackagedArchitecture, package_parts
from ssmport.state import StateSpec


@dataclass
class _Mamba2(PackagedArchitecture):
    def matches_hf_config(self, config_json: Mapping[str, Any]) -> bool:
        return super().matches_hf_config(config_json) or is_mamba_ssm(config_json)

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        return checkpoints.load(config_json, source)

    def state_specs(self, config: Mamba2Config, state_dtype: torch.dtype) -> list[StateSpec]:
        c = config
        return [
            StateSpec(block.CONV_STATE, (c.num_layers, 1, c.conv_kernel, c.conv_dim), state_dtype,
                      "[layer, batch, time: last K conv inputs, oldest first, channel (x|B|C)]"),
            StateSpec(block.SSM_STATE, (c.num_layers, 1, c.num_heads, c.head_dim, c.state_size), state_dtype,
                      "[layer, batch, head, head_dim, state]"),
        ]  # fmt: skip

    def apple_state_splits(self, config: Mamba2Config):
        # convState's x and B|C channels as two states (the conv is depthwise: the split is exact)
        c = config
        return [StateSplit(block.CONV_STATE, 1, (
            StatePart("xConvState", c.intermediate_size, "[layer, batch, time: last K inputs, channel (x)]"),
            StatePart("bcConvState", 2 * c.n_groups * c.state_size, "[layer, batch, time: last K inputs, channel (B|C)]"),
        ))]  # fmt: skip


MAMBA2 = _Mamba2(
    name="mamba2",
    description="Mamba-2 (SSD): conv + SSM states, transformers or mamba_ssm folders",
    hf_architectures=("Mamba2ForCausalLM", "Mamba2Model"),
    presets=PRESETS,
    tiny_preset="mamba2-tiny",
    preset_keys=("vocab_size", "hidden_size", "num_layers", "num_heads", "head_dim", "state_size", "n_groups", "conv_kernel"),
    **package_parts(Mamba2Config, Mamba2Reference, checkpoints, synthetic, block, quant),
)
