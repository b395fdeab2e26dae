"""RWKV-7 "Goose" (x070) config and presets."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ssmport.architectures.base import Preset
from ssmport.errors import CheckpointError

DECAY_SCALE = math.exp(-0.5)  # w = exp(-DECAY_SCALE * sigmoid(.)) keeps each decay in (0.545, 1)
BLINKDL_LN_X_EPS = 64e-5  # BlinkDL's GroupNorm eps (= 1e-5 * head_size_divisor**2, divisor 8)
MIX_NAMES = ("r", "w", "k", "v", "a", "g")  # the six token-shift mixes x_r .. x_g
WORLD_VOCAB_ROWS = 65536


@dataclass(frozen=True)
class RWKV7Config:
    vocab_size: int
    hidden_size: int  # C
    num_layers: int  # L
    head_size: int  # N: key dim per head
    ffn_size: int  # F (4C in released models)
    decay_lora: int  # LoRA ranks, read from w1/a1/v1/g1 when weights are given
    a_lora: int
    v_lora: int
    gate_lora: int
    value_head_size: int | None = None  # per-head value dim; None = head_size (BlinkDL)
    ln_x_eps: float = BLINKDL_LN_X_EPS
    norm_eps: float = 1e-5
    has_ln0: bool = True  # LayerNorm on the embedding before layer 0 (folded at build)

    @property
    def num_heads(self) -> int:
        return self.hidden_size // self.head_size

    @property
    def v_head(self) -> int:
        return self.value_head_size or self.head_size

    @property
    def value_size(self) -> int:
        return self.num_heads * self.v_head

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def validate(self) -> None:
        if self.hidden_size % self.head_size:
            raise CheckpointError(f"hidden size {self.hidden_size} is not a multiple of head size {self.head_size}")

    def describe(self) -> str:
        return f"(L={self.num_layers} C={self.hidden_size} H={self.num_heads} V={self.vocab_size})"


def lora_dims(c: int) -> dict[str, int]:
    """LoRA ranks of RWKV-LM's x070 trainer for width C (the released World models)."""

    def r(x: float) -> int:
        return max(32, int(round(x / 32) * 32))

    return {"decay_lora": r(1.8 * c**0.5), "a_lora": r(1.8 * c**0.5), "v_lora": r(1.3 * c**0.5),
            "gate_lora": r(0.6 * c**0.8)}  # fmt: skip


def _preset(name: str, layers: int, width: int, description: str, released: bool = True, **dims) -> Preset:
    config = {"vocab_size": WORLD_VOCAB_ROWS, "hidden_size": width, "num_layers": layers, "head_size": 64,
              "ffn_size": 4 * width, **lora_dims(width), **dims}  # fmt: skip
    return Preset(name, "rwkv7", config, description, released)


PRESETS = (
    _preset("rwkv7-0.1b", 12, 768, "RWKV-7 World 0.1B (L12 C768)"),
    _preset("rwkv7-0.4b", 24, 1024, "RWKV-7 World 0.4B (L24 C1024)"),
    _preset("rwkv7-1.5b", 24, 2048, "RWKV-7 World 1.5B (L24 C2048)"),
    _preset("rwkv7-2.9b", 32, 2560, "RWKV-7 World 2.9B (L32 C2560)"),
    _preset("rwkv7-tiny", 2, 128, "embedded default: L2 C128, World vocab, synthetic weights from a fixed seed",
            released=False, head_size=32, ffn_size=512, decay_lora=32, a_lora=32, v_lora=32, gate_lora=32),
)  # fmt: skip
