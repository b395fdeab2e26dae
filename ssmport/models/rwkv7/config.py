"""RWKV-7 "Goose" (x070) config and presets."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ssmport.architectures.base import FieldsConfig
from ssmport.architectures.base import HubSource, Preset
from ssmport.errors import CheckpointError

DECAY_SCALE = math.exp(-0.5)  # w = exp(-DECAY_SCALE * sigmoid(.)) keeps each decay in (0.545, 1)
BLINKDL_LN_X_EPS = 64e-5  # BlinkDL's GroupNorm eps (= 1e-5 * head_size_divisor**2, divisor 8)
MIX_NAMES = ("r", "w", "k", "v", "a", "g")  # the six token-shift mixes x_r .. x_g
WORLD_VOCAB_ROWS = 65536


@dataclass(frozen=True)
class RWKV7Config(FieldsConfig):
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


def _preset(name: str, layers: int, width: int, description: str, released: bool = True,
            hub: HubSource | None = None, **dims) -> Preset:  # fmt: skip
    config = {"vocab_size": WORLD_VOCAB_ROWS, "hidden_size": width, "num_layers": layers, "head_size": 64,
              "ffn_size": 4 * width, **lora_dims(width), **dims}  # fmt: skip
    return Preset(name, "rwkv7", config, description, released, hub)


# BlinkDL's releases, one .pth per file (LoRA ranks are read from the file on load; the
# formula above only shapes --synthetic weights). How each name was confirmed is recorded
# with it; `ssmport list` marks the ones that could not be.
_WORLD, _G1 = "BlinkDL/rwkv-7-world", "BlinkDL/rwkv7-g1"
_WORLD_URL = "its resolve/main URL in public READMEs and download scripts"
_G1D = ("hf_hub_download(repo_id='BlinkDL/rwkv7-g1', filename=...) in public code (2026); "
        "candle's rwkv example ships the same files converted")  # fmt: skip
_G1I = None  # file names seen in public code and on the ModelScope mirror of BlinkDL/rwkv7-g1, not on the Hub itself
_RELEASES = (  # (preset, layers, width, description, repo, file, how confirmed)
    ("rwkv7-0.1b", 12, 768, "RWKV-7 World 0.1B (L12 C768)", _WORLD, "RWKV-x070-World-0.1B-v2.8-20241210-ctx4096.pth", _WORLD_URL),
    ("rwkv7-0.4b", 24, 1024, "RWKV-7 World 0.4B (L24 C1024)", _WORLD, "RWKV-x070-World-0.4B-v2.9-20250107-ctx4096.pth", _WORLD_URL),
    ("rwkv7-1.5b", 24, 2048, "RWKV-7 World 1.5B (L24 C2048)", _WORLD, "RWKV-x070-World-1.5B-v3-20250127-ctx4096.pth", _WORLD_URL),
    ("rwkv7-2.9b", 32, 2560, "RWKV-7 World 2.9B (L32 C2560)", _WORLD, "RWKV-x070-World-2.9B-v3-20250211-ctx4096.pth", _WORLD_URL),
    ("rwkv7-g1d-0.1b", 12, 768, "RWKV-7 G1d 0.1B (L12 C768, ctx 8192)", _G1, "rwkv7-g1d-0.1b-20260129-ctx8192.pth", _G1D),
    ("rwkv7-g1d-0.4b", 24, 1024, "RWKV-7 G1d 0.4B (L24 C1024, ctx 8192)", _G1, "rwkv7-g1d-0.4b-20260210-ctx8192.pth", _G1D),
    ("rwkv7-g1d-1.5b", 24, 2048, "RWKV-7 G1d 1.5B (L24 C2048, ctx 8192)", _G1, "rwkv7-g1d-1.5b-20260212-ctx8192.pth", _G1D),
    ("rwkv7-g1d-2.9b", 32, 2560, "RWKV-7 G1d 2.9B (L32 C2560, ctx 8192)", _G1, "rwkv7-g1d-2.9b-20260131-ctx8192.pth", _G1D),
    ("rwkv7-g1d-7.2b", 32, 4096, "RWKV-7 G1d 7.2B (L32 C4096, ctx 8192)", _G1, "rwkv7-g1d-7.2b-20260131-ctx8192.pth", _G1D),
    ("rwkv7-g1d-13.3b", 61, 4096, "RWKV-7 G1d 13.3B (L61 C4096, ctx 8192)", _G1, "rwkv7-g1d-13.3b-20260131-ctx8192.pth", _G1D),
    ("rwkv7-g1i-1.5b", 24, 2048, "RWKV-7 G1i 1.5B (L24 C2048, ctx 16384)", _G1, "rwkv7-g1i-1.5b-20260805-ctx16384.pth", _G1I),
    ("rwkv7-g1i-2.9b", 32, 2560, "RWKV-7 G1i 2.9B (L32 C2560, ctx 16384)", _G1, "rwkv7-g1i-2.9b-20260805-ctx16384.pth", _G1I),
    ("rwkv7-g1i-7.2b", 32, 4096, "RWKV-7 G1i 7.2B (L32 C4096, ctx 16384)", _G1, "rwkv7-g1i-7.2b-20260805-ctx16384.pth", _G1I),
    ("rwkv7-g1i-13.3b", 61, 4096, "RWKV-7 G1i 13.3B (L61 C4096, ctx 16384)", _G1, "rwkv7-g1i-13.3b-20260805-ctx16384.pth", _G1I),
)  # fmt: skip

PRESETS = (
    *(_preset(n, L, C, d, hub=HubSource(repo, file, confirmed=how)) for n, L, C, d, repo, file, how in _RELEASES),
    _preset("rwkv7-tiny", 2, 128, "synthetic test model: L2 C128, World vocab, random weights from a fixed seed",
            released=False, head_size=32, ffn_size=512, decay_lora=32, a_lora=32, v_lora=32, gate_lora=32),
    # Weights ship with ssmport (ssmport/loader/pretrained); vocab 256 bytes + end of text, padded to 320.
    _preset("rwkv7-pydoc", 4, 256, "embedded default: L4 C256 byte-level, trained on the Python 3.11 docs "
            "(ssmport/loader/pretrained)", vocab_size=320),
)  # fmt: skip
