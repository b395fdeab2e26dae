"""RWKV-6 "Finch" (x060) config and presets."""

from __future__ import annotations

from dataclasses import dataclass

from ssmport.architectures.base import FieldsConfig, HubSource, Preset
from ssmport.errors import CheckpointError
from ssmport.models.rwkv7.config import BLINKDL_LN_X_EPS, WORLD_VOCAB_ROWS

# The five data-dependent mixes, in the order of time_maa_w1's column groups and time_maa_w2's rows.
MIX_NAMES = ("w", "k", "v", "r", "g")


@dataclass(frozen=True)
class RWKV6Config(FieldsConfig):
    vocab_size: int
    hidden_size: int  # C
    num_layers: int  # L
    attention_size: int  # A = H * N: r/k/v/g width (BlinkDL's dim_att; C in released models)
    head_size: int  # N: key and value dim per head (the x060 format has one head size)
    ffn_size: int  # F
    mix_lora: int  # rank of each of the five token-shift LoRAs (time_maa_w1: [C, 5 * rank])
    decay_lora: int  # rank of the decay LoRA (time_decay_w1: [C, rank])
    ln_x_eps: float = BLINKDL_LN_X_EPS  # RWKV-LM x060: GroupNorm eps 1e-5 * head_size_divisor**2 (8)
    norm_eps: float = 1e-5
    has_ln0: bool = True  # LayerNorm on the embedding before layer 0 (folded at build)

    @property
    def num_heads(self) -> int:
        return self.attention_size // self.head_size

    @property
    def v_head(self) -> int:  # the value dim per head: the key's (RWKV-7's name, for the code they share)
        return self.head_size

    def validate(self) -> None:
        if self.attention_size % self.head_size:
            raise CheckpointError(f"attention size {self.attention_size} is not a multiple of head size {self.head_size}")

    def describe(self) -> str:
        return f"(L={self.num_layers} C={self.hidden_size} H={self.num_heads} V={self.vocab_size})"


def _preset(name: str, layers: int, width: int, description: str, released: bool = True,
            hub: HubSource | None = None, **dims) -> Preset:  # fmt: skip
    # RWKV-LM x060 World: dim_att = C, head 64, FFN int(3.5 C) rounded down to 32, LoRA ranks
    # 32 (mix) and 64 (decay); 64 / 128 from C = 4096 on. The ranks are read from the file on
    # load; these only shape --synthetic weights.
    big = width >= 4096
    config = {"vocab_size": WORLD_VOCAB_ROWS, "hidden_size": width, "num_layers": layers, "attention_size": width,
              "head_size": 64, "ffn_size": int(width * 3.5) // 32 * 32, "mix_lora": 64 if big else 32,
              "decay_lora": 128 if big else 64, **dims}  # fmt: skip
    return Preset(name, "rwkv6", config, description, released, hub)


_WORLD = "BlinkDL/rwkv-6-world"
# Each file as a huggingface.co/BlinkDL/rwkv-6-world/blob/main/<file> link in public READMEs (RWKV's
# own model tables among them) and RWKV-Runner's model list; the Hub itself not fetched here.
_HOW = "huggingface.co/BlinkDL/rwkv-6-world/blob/main/<file> links in public READMEs and RWKV-Runner's model list"
_RELEASES = (  # (preset, layers, width, description, file)
    ("rwkv6-1.6b", 24, 2048, "RWKV-6 World 1.6B (L24 C2048)", "RWKV-x060-World-1B6-v2.1-20240328-ctx4096.pth"),
    ("rwkv6-3b", 32, 2560, "RWKV-6 World 3B (L32 C2560)", "RWKV-x060-World-3B-v2.1-20240417-ctx4096.pth"),
    ("rwkv6-7b", 32, 4096, "RWKV-6 World 7B (L32 C4096)", "RWKV-x060-World-7B-v2.1-20240507-ctx4096.pth"),
    ("rwkv6-14b", 61, 4096, "RWKV-6 World 14B (L61 C4096)", "RWKV-x060-World-14B-v2.1-20240719-ctx4096.pth"),
)  # fmt: skip

PRESETS = (
    *(_preset(n, L, C, d, hub=HubSource(_WORLD, f, confirmed=_HOW)) for n, L, C, d, f in _RELEASES),
    # Non-square where the format allows: A != C (K = V per head is fixed by x060's one head size).
    _preset("rwkv6-tiny", 2, 96, "synthetic test model: L2 C96 A128 H4, vocab 512, random weights from a fixed seed",
            released=False, vocab_size=512, attention_size=128, head_size=32, ffn_size=320, mix_lora=16, decay_lora=24),
)  # fmt: skip
