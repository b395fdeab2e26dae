"""RecurrentGemma (Google's Griffin): RG-LRU recurrent blocks and local attention. The
architecture object: its states are constant whatever the context (the attention keeps a
ring of its window's K / V rows, not a KV cache)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.hybrid import MAX_CONTEXT, check_context
from ssmport.models.layers import CONV_STATES, RECURRENT_STATES
from ssmport.models.package import PackagedArchitecture, package_parts
from ssmport.models.recurrent_gemma import block, checkpoints, quant, synthetic
from ssmport.models.recurrent_gemma.config import ATTENTION, PRESETS, RECURRENT, RecurrentGemmaConfig
from ssmport.models.recurrent_gemma.reference import RecurrentGemmaReference
from ssmport.state import StateSpec


@dataclass
class RecurrentGemmaArchitecture(PackagedArchitecture):
    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        return checkpoints.load(config_json, source)

    def state_specs(self, c: RecurrentGemmaConfig, dtype: torch.dtype) -> list[StateSpec]:
        """convStates and recurrentStates of the recurrent layers, then the attention layers'
        rings (block.ring_specs); the RG-LRU state is fp32 math whatever its storage dtype."""
        rec, D = c.layers_of(RECURRENT), c.lru_width
        return block.ring_specs(c, dtype) + [
            StateSpec(CONV_STATES, (rec, 1, c.conv_width - 1, D), dtype,
                      "[recurrent layer, batch, time: the last K-1 conv inputs, oldest first, channel (linear_x)]"),
            StateSpec(RECURRENT_STATES, (rec, 1, D), dtype, "[recurrent layer, batch, channel]: the RG-LRU state h"),
        ]  # fmt: skip

    def with_context(self, config: RecurrentGemmaConfig, context: int) -> RecurrentGemmaConfig:
        """--context is accepted and changes nothing: no state grows with the sequence."""
        check_context(context, MAX_CONTEXT)
        return config


RECURRENT_GEMMA = RecurrentGemmaArchitecture(
    name="recurrent_gemma",
    description="RecurrentGemma (Google Griffin): RG-LRU recurrences + local attention on a ring: constant state",
    hf_architectures=("RecurrentGemmaForCausalLM",),
    presets=PRESETS,
    tiny_preset="recurrentgemma-tiny",
    preset_keys=("vocab_size", "hidden_size", "layer_types", "num_heads", "num_kv_heads", "lru_width",
                 "intermediate_size", "window"),  # fmt: skip
    **package_parts(RecurrentGemmaConfig, RecurrentGemmaReference, checkpoints, synthetic, block, quant),
)

__all__ = ["ATTENTION", "RECURRENT", "RECURRENT_GEMMA"]
