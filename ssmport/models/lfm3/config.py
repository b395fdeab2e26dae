"""LFM3 config (transformers 5.24's Lfm3Config keys), presets.

Per layer kind: "conv" (LFM2's gated short conv), "sliding_attention" (a sliding window over a
ring state) and "full_attention" (a KV cache sized by --context). RoPE is set per attention
kind; both transformers' "default" and "proportional" types are the proportional form (the
pairs (i, i + d/2) at theta^(-2i/d)) with a rotating fraction: "default" rotates every pair
(transformers' LFM3 ignores a partial_rotary_factor on it), "proportional" the first
partial_rotary_factor of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ssmport.architectures.base import HubSource, Preset
from ssmport.errors import CheckpointError
from ssmport.models.hybrid import ATTENTION, CONV, DEFAULT_CONTEXT, SLIDING, HybridConfig, layer_kinds, ring_window
from ssmport.models.layers.attention import AttentionSpec
from ssmport.models.lfm2.config import Lfm2Config
from ssmport.models.loading import ConfigReader

LAYER_KINDS = (CONV, SLIDING, ATTENTION)
ROPE_TYPES = ("default", "proportional")
MAX_POSITIONS = 128_000  # transformers' default max_position_embeddings


@dataclass(frozen=True)
class Lfm3Config(HybridConfig):
    vocab_size: int
    hidden_size: int  # H
    layer_types: tuple[str, ...]  # per layer: "conv" | "sliding_attention" | "full_attention"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # the SwiGLU width, as is (no LFM2 auto-adjust)
    sliding_window: int = 256  # W: a sliding layer's token sees W positions, itself included
    conv_kernel: int = 7  # conv_L_cache
    conv_bias: bool = False
    attention_bias: bool = False  # biases on q/k/v/o (the gate has none)
    attention_gate: bool = True  # use_attention_gate: head h's output *= sigmoid(gate_proj(x))[h]
    sandwich_norm: bool = True  # use_sandwich_norm: RMSNorm on the operator's and the MLP's outputs
    norm_eps: float = 1e-5
    full_rope_theta: float = 1e6
    full_rope_fraction: float = 0.5  # the fraction of rotary pairs that rotate (proportional RoPE)
    sliding_rope_theta: float = 1e4
    sliding_rope_fraction: float = 1.0
    context: int = DEFAULT_CONTEXT  # positions the full-attention KV cache holds (--context)
    max_position_embeddings: int = MAX_POSITIONS

    def attention_of(self, kind: str) -> AttentionSpec:
        """The attention of a "full_attention" or "sliding_attention" layer: q/k RMSNorm per head,
        proportional RoPE of the kind's theta and fraction, the per-head gate, scale head_dim^-0.5."""
        sliding = kind == SLIDING
        theta, fraction = ((self.sliding_rope_theta, self.sliding_rope_fraction) if sliding
                           else (self.full_rope_theta, self.full_rope_fraction))  # fmt: skip
        return AttentionSpec(self.num_heads, self.num_kv_heads, self.head_dim, rotary_dim=2 * int(fraction * self.head_dim // 2),
                             rope_theta=theta, qk_norm="rms", norm_eps=self.norm_eps, bias=self.attention_bias,
                             window=self.sliding_window if sliding else None, rope_proportional=True,
                             head_gate=self.attention_gate)  # fmt: skip

    def validate(self) -> None:
        Lfm2Config.validate(self, "LFM3", LAYER_KINDS)
        if not 1 <= self.sliding_window <= self.max_position_embeddings:
            raise CheckpointError(f"LFM3: sliding_window {self.sliding_window} is not in [1, max_position_embeddings]")

    def describe(self) -> str:
        return (f"(L={self.num_layers}: {self.layers_of(CONV)} conv + {self.layers_of(SLIDING)} sliding (window "
                f"{self.sliding_window}) + {self.attention_layers} full attention, H={self.hidden_size}, heads "
                f"{self.num_heads}/{self.num_kv_heads}x{self.head_dim}, F={self.intermediate_size}, V={self.vocab_size})")  # fmt: skip


def default_layer_types(layers: int) -> tuple[str, ...]:
    """transformers' default: full attention at i % 4 == 2, sliding at i % 4 == 0 (i > 0), else conv."""
    return tuple(ATTENTION if i % 4 == 2 else SLIDING if i % 4 == 0 and i > 0 else CONV for i in range(layers))


def _rope(r: ConfigReader, kinds: tuple[str, ...]) -> dict[str, float]:
    """{full,sliding}_rope_{theta,fraction} from rope_parameters (per layer kind, or one set for
    both); the kinds the model lacks keep their defaults."""
    params = r.raw("rope_parameters", None)
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise CheckpointError(f"{r.origin}: config.json rope_parameters={params!r} is not an object")
    per_kind = any(isinstance(v, Mapping) for v in params.values()) or not params  # else one set for both kinds
    unknown = sorted(set(params) - {ATTENTION, SLIDING}) if per_kind else []
    if unknown:
        raise r.unsupported(f"rope_parameters for layer kind(s) {', '.join(map(repr, unknown))} (LFM3 has "
                            f"{ATTENTION} and {SLIDING})")  # fmt: skip
    out = {}
    for kind, prefix in ((ATTENTION, "full"), (SLIDING, "sliding")):
        if kind not in kinds:
            continue
        given = params.get(kind) if per_kind else params
        if not isinstance(given, Mapping):
            raise CheckpointError(f"{r.origin}: config.json rope_parameters has no object for {kind!r}")
        p = ConfigReader(given, f"{r.origin} (rope_parameters {kind})", "LFM3")
        rope_type = given.get("rope_type", given.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise r.unsupported(f"rope_type {rope_type!r} on {kind} layers (supported: {', '.join(ROPE_TYPES)})")
        if p.float("factor", 1.0, positive=True) != 1.0:
            raise r.unsupported(f"a rope factor {given['factor']!r} on {kind} layers")
        fraction = p.float("partial_rotary_factor", 1.0) if rope_type == "proportional" else 1.0
        if not 0.0 <= fraction <= 1.0:
            raise CheckpointError(f"{r.origin}: config.json partial_rotary_factor={fraction} is not in [0, 1]")
        out |= {f"{prefix}_rope_theta": p.float("rope_theta", 1e6, positive=True), f"{prefix}_rope_fraction": fraction}
    return out


def from_transformers(cj: Mapping[str, Any], origin: str) -> tuple[Lfm3Config, bool]:
    """(config, tied) from an Lfm3Config config.json; missing keys take transformers' defaults.
    LFM2's block_* keys, which transformers' Lfm3Config removes, are not read: the MLP is
    intermediate_size wide, as transformers builds it."""
    r = ConfigReader(cj, origin, "LFM3")
    layers = r.layers("num_hidden_layers", 24)
    kinds = layer_kinds(cj["layer_types"], LAYER_KINDS, r, "layer_types") if cj.get("layer_types") is not None \
        else default_layer_types(layers)  # fmt: skip
    if len(kinds) != layers:
        raise CheckpointError(f"{origin}: config.json has {len(kinds)} layer_types for num_hidden_layers={layers}")
    window = r.raw("sliding_window", 256)
    if window is None and SLIDING in kinds:
        raise r.unsupported("sliding_window=null on sliding_attention layers")
    max_positions = r.int("max_position_embeddings", MAX_POSITIONS, hi=1 << 24)
    cfg = Lfm3Config(
        vocab_size=r.int("vocab_size", 128_000), hidden_size=r.int("hidden_size", 2048), layer_types=kinds,
        num_heads=r.int("num_attention_heads", 16), num_kv_heads=r.int("num_key_value_heads", 4),
        head_dim=r.int("head_dim", 128), intermediate_size=r.int("intermediate_size", 7680),
        sliding_window=256 if window is None else ring_window(r, "sliding_window", 256), conv_kernel=r.int("conv_L_cache", 7),
        conv_bias=r.bool("conv_bias", False), attention_bias=r.bool("attention_bias", False),
        attention_gate=r.bool("use_attention_gate", True), sandwich_norm=r.bool("use_sandwich_norm", True),
        norm_eps=r.float("norm_eps", 1e-5, positive=True), context=min(DEFAULT_CONTEXT, max_positions),
        max_position_embeddings=max_positions, **_rope(r, kinds),
    )  # fmt: skip
    return cfg, r.bool("tie_word_embeddings", True)


_UNCONFIRMED = None  # no config.json of the release was readable here: transformers' defaults stand in

PRESETS = (
    Preset("lfm3-1.7b", "lfm3",
           {"vocab_size": 128_000, "hidden_size": 2048, "layer_types": list(default_layer_types(24)), "num_heads": 16,
            "num_kv_heads": 4, "head_dim": 128, "intermediate_size": 7680},
           "LiquidAI LFM3-1.7B (24 layers: 13 conv + 5 sliding, window 256 + 6 full attention, H2048, 16/4 heads of "
           "128, MLP 7680): transformers' Lfm3Config defaults, which it documents as LFM3-1.7B-style; the released "
           "config.json unconfirmed", True, HubSource("LiquidAI/LFM3-1.7B", confirmed=_UNCONFIRMED)),
    Preset("lfm3-tiny", "lfm3",
           {"vocab_size": 512, "hidden_size": 128, "layer_types": [CONV, SLIDING, ATTENTION, CONV, SLIDING, CONV],
            "num_heads": 4, "num_kv_heads": 2, "head_dim": 24, "intermediate_size": 256, "sliding_window": 8,
            "conv_kernel": 3, "context": 64},
           "test model: 6 layers (conv, sliding, full attention, conv, sliding, conv), H128, 4/2 heads of 24, "
           "window 8, K3, synthetic weights from a fixed seed", released=False),
)  # fmt: skip
