"""Qwen3.5 (transformers `Qwen3_5ForCausalLM` / `Qwen3_5ForConditionalGeneration`): Gated
DeltaNet layers and gated full-attention layers with a KV cache; the architecture object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.checkpoint import TensorSource
from ssmport.errors import CheckpointError
from ssmport.models.hybrid import HybridArchitecture
from ssmport.models.layers import KEY_CACHE, VALUE_CACHE
from ssmport.models.package import package_parts
from ssmport.models.qwen3_5 import block, checkpoints, quant, synthetic
from ssmport.models.qwen3_5.config import LINEAR, PRESETS, Qwen35Config
from ssmport.models.qwen3_5.reference import Qwen35Reference
from ssmport.state import KV, StateSpec

TEXT_TYPES = ("qwen3_5", "qwen3_5_text")
# Same family, other MLPs: refused by name, with what ssmport lacks for them.
REFUSED_TYPES = {
    "qwen3_5_moe": "Qwen3.5-MoE (routed experts and a shared expert in every MLP)",
    "qwen3_5_moe_text": "Qwen3.5-MoE (routed experts and a shared expert in every MLP)",
    "qwen3_next": "Qwen3-Next (routed experts, and a fused in_proj_qkvz with a per-group layout)",
}


@dataclass
class _Qwen35(HybridArchitecture):  # the hybrids' context and apple layout, its own loader and states
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
        c = config
        kv = (c.attention_layers, 1, c.num_key_value_heads, c.context, c.head_dim)
        kv_layout = "[attention layer, batch, kv head, position, head_dim] (K after k-norm and RoPE)"
        return [
            StateSpec(KEY_CACHE, kv, state_dtype, kv_layout, KV),
            StateSpec(VALUE_CACHE, kv, state_dtype, kv_layout.removesuffix(" (K after k-norm and RoPE)"), KV),
            StateSpec(block.CONV_STATES, (c.layers_of(LINEAR), 1, c.linear_conv_kernel_dim, c.delta_rule.conv_dim), state_dtype,
                      "[linear layer, batch, conv tap (oldest first), channel (q | k | v pre-conv)]"),
            StateSpec(block.RECURRENT_STATES, (c.layers_of(LINEAR), 1, c.linear_num_value_heads, c.linear_key_head_dim,
                                               c.linear_value_head_dim), state_dtype,
                      "[linear layer, batch, value head, key, value]"),
        ]  # fmt: skip


QWEN3_5 = _Qwen35(
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
