"""RWKV-7 "Goose" (x070): the architecture object (its parts are this package's modules)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.rwkv7 import block, checkpoints, quant, synthetic
from ssmport.models.rwkv7.config import PRESETS, WORLD_VOCAB_ROWS, RWKV7Config
from ssmport.models.rwkv7.reference import RWKV7Reference
from ssmport.state import StatePart, StateSplit
from ssmport.models.package import PackagedArchitecture, package_parts
from ssmport.ops import wkv7
from ssmport.state import StateSpec


@dataclass
class _RWKV7(PackagedArchitecture):
    def matches_pth(self, source: TensorSource) -> bool:
        return "blocks.0.att.r_k" in source and "blocks.0.att.w1" in source

    def load_pth(self, source: TensorSource):
        return checkpoints.load_blinkdl(source)

    def load_hf(self, config_json: Mapping[str, Any], source: TensorSource):
        return checkpoints.load_fla(config_json, source)

    def state_specs(self, config: RWKV7Config, state_dtype: torch.dtype) -> list[StateSpec]:
        c = config
        return [
            StateSpec(block.REC_STATE, (c.num_layers, 1, c.num_heads, c.head_size, c.v_head), state_dtype,
                      "[layer, batch, head, key, value]"),
            StateSpec(block.SHIFT_STATE, (c.num_layers, 1, 2, c.hidden_size), state_dtype,
                      "[layer, batch, (time-mix, channel-mix), hidden]"),
        ]  # fmt: skip

    def apple_state_splits(self, config: RWKV7Config):
        # shiftState's two rows as two states: three fixed states (docs/apple-engines.md, section 8)
        return [StateSplit(block.SHIFT_STATE, 0, (
            StatePart("attnShiftState", 1, "[layer, batch, hidden] time-mix input (after ln1) of the last token"),
            StatePart("ffnShiftState", 1, "[layer, batch, hidden] channel-mix input (after ln2) of the last token"),
        ))]  # fmt: skip

    def default_vocab(self, config: RWKV7Config):
        # Every RWKV-7 World model (65,536-row embedding) uses rwkv_vocab_v20230424;
        # BlinkDL's .pth releases ship without it.
        if config.vocab_size == WORLD_VOCAB_ROWS:
            from ssmport.tokenizers import BUNDLED_WORLD_VOCAB

            return BUNDLED_WORLD_VOCAB, "bundled rwkv_vocab_v20230424 (World models)"
        return None


RWKV7 = _RWKV7(
    name="rwkv7",
    description="RWKV-7 Goose (x070): WKV-7 delta-rule state, BlinkDL .pth or fla HF folders",
    hf_architectures=("RWKV7ForCausalLM", "RWKV7Model"),
    presets=PRESETS,
    tiny_preset="rwkv7-tiny",
    preset_keys=("vocab_size", "hidden_size", "num_layers", "head_size", "ffn_size"),  # LoRA ranks: the weights say
    max_prefill_chunk=wkv7.MAX_CHUNK,
    **package_parts(RWKV7Config, RWKV7Reference, checkpoints, synthetic, block, quant),
)
