"""Gated DeltaNet (fla `GatedDeltaNetForCausalLM`): the architecture object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.loader.checkpoint import TensorSource
from ssmport.errors import CheckpointError
from ssmport.models.gated_deltanet import block, checkpoints, quant, synthetic
from ssmport.models.gated_deltanet.config import PRESETS, GatedDeltaNetConfig
from ssmport.models.gated_deltanet.reference import GatedDeltaNetReference
from ssmport.state import StatePart, StateSplit
from ssmport.models.package import PackagedArchitecture, package_parts
from ssmport.state import StateSpec


@dataclass
class _GatedDeltaNet(PackagedArchitecture):
    def matches_pth(self, source: TensorSource) -> bool:
        return "model.layers.0.attn.A_log" in source and "model.layers.0.attn.q_conv1d.weight" in source

    def load_pth(self, source: TensorSource):
        raise CheckpointError(f"{source.origin}: Gated DeltaNet weights load from an fla Hugging Face folder "
                              "(config.json + safetensors), not a bare .pth")  # fmt: skip

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        return checkpoints.load_fla(config_json, source)

    def state_specs(self, config: GatedDeltaNetConfig, state_dtype: torch.dtype) -> list[StateSpec]:
        c = config
        return [
            StateSpec(block.CONV_STATE, (c.num_layers, 1, c.conv_size - 1, c.conv_dim), state_dtype,
                      "[layer, batch, conv tap (oldest first), channel (q | k | v pre-conv projections)]"),
            StateSpec(block.REC_STATE, (c.num_layers, 1, c.num_v_heads, c.head_dim, c.head_v_dim), state_dtype,
                      "[layer, batch, value head, key, value]"),
        ]  # fmt: skip

    def apple_state_splits(self, config: GatedDeltaNetConfig):
        # convState's q|k and v channels as two states (the convs are depthwise: the split is exact)
        c = config
        return [StateSplit(block.CONV_STATE, 1, (
            StatePart("qkConvState", 2 * c.key_dim, "[layer, batch, conv tap (oldest first), channel (q | k)]"),
            StatePart("vConvState", c.value_dim, "[layer, batch, conv tap (oldest first), channel (v)]"),
        ))]  # fmt: skip


GATED_DELTANET = _GatedDeltaNet(
    name="gated_deltanet",
    description="Gated DeltaNet (fla GatedDeltaNetForCausalLM): gated delta-rule state, short convs, SwiGLU",
    hf_architectures=("GatedDeltaNetForCausalLM", "GatedDeltaNetModel"),
    presets=PRESETS,
    tiny_preset="gated-deltanet-tiny",
    preset_keys=("vocab_size", "hidden_size", "num_layers", "num_heads", "head_dim", "num_v_heads", "head_v_dim",
                 "intermediate_size"),
    **package_parts(GatedDeltaNetConfig, GatedDeltaNetReference, checkpoints, synthetic, block, quant),
)
