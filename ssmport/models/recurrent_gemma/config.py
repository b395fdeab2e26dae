"""RecurrentGemma config (transformers' RecurrentGemmaConfig keys), presets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssmport.architectures.base import HubSource, Preset
from ssmport.errors import CheckpointError
from ssmport.models.hybrid import HybridConfig, ring_window, rope_theta
from ssmport.models.layers.attention import AttentionSpec
from ssmport.models.loading import ConfigReader

RECURRENT, ATTENTION = "recurrent", "attention"  # config.json block_types, repeated over the layers


@dataclass(frozen=True)
class RecurrentGemmaConfig(HybridConfig):
    vocab_size: int
    hidden_size: int  # H
    layer_types: tuple[str, ...]  # per layer: "recurrent" (conv + RG-LRU) | "attention" (local)
    num_heads: int  # attention heads, and the RG-LRU gates' blocks
    num_kv_heads: int
    lru_width: int  # D: the recurrent branch's width
    intermediate_size: int  # the MLP width as built: config.json's intermediate_size // 2
    window: int = 2048  # attention_window_size: keys a query sees, itself included
    conv_width: int = 4  # conv1d_width: the taps of the conv before the RG-LRU
    logits_soft_cap: float = 30.0
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.5
    attention_bias: bool = False  # q/k/v biases (o_proj always has one)

    @property
    def head_dim(self) -> int:  # transformers sets it so, whatever config.json says
        return self.hidden_size // self.num_heads

    @property
    def embed_scale(self) -> float:
        """sqrt(H) rounded to bf16, as transformers' `normalizer` buffer holds it (2560: 50.5 not 50.596)."""
        return float(torch.tensor(self.hidden_size**0.5, dtype=torch.bfloat16))

    @property
    def attention(self) -> AttentionSpec:
        """Rotate-half RoPE on the first int(head_dim * partial_rotary_factor) dims; scale
        head_dim^-0.5; the window over a ring; q/k/v/o biases with attention_bias (else o's alone)."""
        return AttentionSpec(self.num_heads, self.num_kv_heads, self.head_dim, rotary_dim=self.rotary_dim,
                             rope_theta=self.rope_theta, bias=self.attention_bias, window=self.window)  # fmt: skip

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def validate(self) -> None:
        problems = {
            f"lru_width={self.lru_width} not a multiple of num_attention_heads={self.num_heads}": self.lru_width % self.num_heads,
            f"num_attention_heads={self.num_heads} not a multiple of num_key_value_heads={self.num_kv_heads}":
                self.num_heads % self.num_kv_heads,
            f"an odd rotary width {self.rotary_dim} (RoPE rotates pairs)": self.rotary_dim % 2,
            f"partial_rotary_factor={self.partial_rotary_factor} (above 1)": self.partial_rotary_factor > 1,
            f"conv1d_width={self.conv_width} (at least 2 taps)": self.conv_width < 2,
            "no recurrent layer": not self.layers_of(RECURRENT),
        }  # fmt: skip
        for what, bad in problems.items():
            if bad:
                raise CheckpointError(f"RecurrentGemma config with {what} is not supported")

    def describe(self) -> str:
        return (f"(L={self.num_layers}: {self.layers_of(RECURRENT)} recurrent + {self.layers_of(ATTENTION)} attention, "
                f"H={self.hidden_size}, D={self.lru_width}, heads {self.num_heads}/{self.num_kv_heads}x{self.head_dim}, "
                f"window {self.window}, F={self.intermediate_size}, V={self.vocab_size})")  # fmt: skip


def from_transformers(cj: Mapping[str, Any], origin: str) -> tuple[RecurrentGemmaConfig, bool]:
    """(config, tied) from a RecurrentGemmaConfig config.json; missing keys take transformers' defaults."""
    r = ConfigReader(cj, origin, "RecurrentGemma")
    hidden, heads, layers = r.int("hidden_size", 2560), r.int("num_attention_heads", 10), r.layers("num_hidden_layers", 26)
    kinds = r.raw("block_types", [RECURRENT, RECURRENT, ATTENTION])
    if not isinstance(kinds, list) or not kinds or any(k not in (RECURRENT, ATTENTION) for k in kinds):
        raise r.unsupported(f"block_types={kinds!r} (a list of 'recurrent' / 'attention')")
    act = r.raw("hidden_activation", "gelu_pytorch_tanh")
    rope = r.raw("rope_parameters", None)  # its partial_rotary_factor, else the top-level one (transformers moves it in)
    rope = ConfigReader(rope if isinstance(rope, Mapping) else {}, origin, "RecurrentGemma",
                        defaults={"partial_rotary_factor": r.raw("partial_rotary_factor", 0.5)})  # fmt: skip
    r.refuse({f"hidden_activation {act!r} (only gelu_pytorch_tanh)": act != "gelu_pytorch_tanh"})
    windows = {k: cj[k] for k in ("attention_window_size", "sliding_window") if cj.get(k) is not None}
    r.refuse({f"attention_window_size={windows.get('attention_window_size')!r} and sliding_window="
              f"{windows.get('sliding_window')!r} (transformers reads them as one)": len(set(map(repr, windows.values()))) > 1})
    unset = lambda key, default: default if cj.get(key) is None else r.int(key)  # noqa: E731  null: the default
    cfg = RecurrentGemmaConfig(
        vocab_size=r.int("vocab_size", 256000), hidden_size=hidden, layer_types=tuple((kinds * layers)[:layers]),
        num_heads=heads, num_kv_heads=unset("num_key_value_heads", heads), lru_width=unset("lru_width", hidden),
        intermediate_size=r.int("intermediate_size", 3 * 2560, lo=2) // 2,
        window=ring_window(r, next(iter(windows), "attention_window_size"), 2048),  # transformers maps one to the other
        conv_width=r.int("conv1d_width", 4), logits_soft_cap=r.float("logits_soft_cap", 30.0, positive=True),
        norm_eps=r.float("rms_norm_eps", 1e-6, positive=True), rope_theta=rope_theta(r, 10000.0),
        partial_rotary_factor=rope.float("partial_rotary_factor", positive=True),
        attention_bias=r.bool("attention_bias", False),
    )  # fmt: skip
    return cfg, r.bool("tie_word_embeddings", True)


# The releases (docs/recurrent_gemma.md): vocab 256000, conv 4, window 2048, rope 10000 on half
# of each 256-wide head, one kv head, soft cap 30, tied. Shapes from the Griffin paper and
# transformers' defaults; the 2B's count (2.68B) is near the 2.7B it is known by.
_UNCONFIRMED = None  # no config.json of these repos was read here


def _preset(name: str, repo: str, layers: int, hidden: int, heads: int, description: str) -> Preset:
    kinds = ([RECURRENT, RECURRENT, ATTENTION] * layers)[:layers]
    config = {"vocab_size": 256000, "hidden_size": hidden, "layer_types": kinds, "num_heads": heads, "num_kv_heads": 1,
              "lru_width": hidden, "intermediate_size": 3 * hidden}  # fmt: skip
    return Preset(name, "recurrent_gemma", config, description, True, HubSource(repo, confirmed=_UNCONFIRMED))


PRESETS = (
    _preset("recurrentgemma-2b", "google/recurrentgemma-2b", 26, 2560, 10,
            "Google RecurrentGemma-2B (26 layers: 18 RG-LRU + 8 local attention, H2560, 10/1 heads; unconfirmed)"),
    _preset("recurrentgemma-2b-it", "google/recurrentgemma-2b-it", 26, 2560, 10,
            "Google RecurrentGemma-2B instruction-tuned (the 2B's shape; unconfirmed)"),
    _preset("recurrentgemma-9b", "google/recurrentgemma-9b", 38, 4096, 16,
            "Google RecurrentGemma-9B (38 layers: 26 RG-LRU + 12 local attention, H4096, 16/1 heads; unconfirmed)"),
    _preset("recurrentgemma-9b-it", "google/recurrentgemma-9b-it", 38, 4096, 16,
            "Google RecurrentGemma-9B instruction-tuned (the 9B's shape; unconfirmed)"),
    Preset("recurrentgemma-tiny", "recurrent_gemma",
           {"vocab_size": 512, "hidden_size": 96, "layer_types": [RECURRENT, RECURRENT, ATTENTION, RECURRENT],
            "num_heads": 4, "num_kv_heads": 2, "lru_width": 80, "intermediate_size": 192, "window": 8},
           "test model: 4 layers (recurrent, recurrent, attention, recurrent), H96, D80, 4/2 heads of 24, window 8, "
           "synthetic weights from a fixed seed", released=False),
)  # fmt: skip
