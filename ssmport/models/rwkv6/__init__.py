"""RWKV-6 "Finch" (x060): the architecture object (its parts are this package's modules)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.package import PackagedArchitecture, package_parts
from ssmport.models.rwkv6 import block, checkpoints, quant, synthetic
from ssmport.models.rwkv6.config import PRESETS, RWKV6Config
from ssmport.models.rwkv6.reference import RWKV6Reference
from ssmport.models.rwkv7 import RWKV7
from ssmport.state import StateSpec


@dataclass
class _RWKV6(PackagedArchitecture):
    def matches_pth(self, source: TensorSource) -> bool:
        return checkpoints.is_x060(source)

    def load_pth(self, source: TensorSource):
        return checkpoints.load_blinkdl(source)

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        return checkpoints.load_fla(config_json, source)

    def state_specs(self, config: RWKV6Config, state_dtype: torch.dtype) -> list[StateSpec]:
        # RWKV-7's two states: recState [L, 1, H, K, V] key-major (K = V in x060) and shiftState
        return RWKV7.state_specs(config, state_dtype)

    def apple_state_splits(self, config: RWKV6Config):
        # shiftState's two rows as two states, as RWKV-7's (docs/apple-engines.md, section 8)
        return RWKV7.apple_state_splits(config)

    def default_vocab(self, config: RWKV6Config):
        return RWKV7.default_vocab(config)  # the same World vocab (rwkv_vocab_v20230424), 65,536 rows


RWKV6 = _RWKV6(
    name="rwkv6",
    description="RWKV-6 Finch (x060): WKV-6 data-dependent decay state, BlinkDL .pth or fla HF folders",
    hf_architectures=("RWKV6ForCausalLM", "RWKV6Model"),
    presets=PRESETS,
    tiny_preset="rwkv6-tiny",
    preset_keys=("vocab_size", "hidden_size", "num_layers", "attention_size", "head_size", "ffn_size"),  # LoRA ranks: the weights say
    **package_parts(RWKV6Config, RWKV6Reference, checkpoints, synthetic, block, quant),
)
