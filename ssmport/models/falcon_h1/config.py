"""Falcon-H1 config (transformers' FalconH1Config), presets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ssmport.architectures.base import HubSource, Preset
from ssmport.errors import CheckpointError
from ssmport.models.hybrid import DEFAULT_CONTEXT, MAX_CONTEXT, HybridConfig, max_positions_from, refuse_dt_clamp, rope_theta
from ssmport.models.layers.attention import AttentionSpec
from ssmport.models.layers.mamba2_mixer import MixerSpec
from ssmport.models.loading import ConfigReader

HYBRID = "hybrid"  # transformers' layer kind: attention and Mamba-2 side by side in one layer
SSM_SEGMENTS = ("z", "x", "B", "C", "dt")  # ssm_multipliers' order: the segments of in_proj's output


@dataclass(frozen=True)
class FalconH1Config(HybridConfig):
    vocab_size: int
    hidden_size: int  # H
    num_hidden_layers: int  # every layer: attention + Mamba-2 in parallel, then the MLP
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # F of the SwiGLU MLP
    mamba_heads: int
    mamba_head_dim: int  # mamba_heads * mamba_head_dim = mamba_d_ssm (not expand * H)
    state_size: int  # N
    n_groups: int
    conv_kernel: int = 4
    conv_bias: bool = True
    proj_bias: bool = False  # mamba in_proj (mamba_proj_bias) and out_proj (projectors_bias) biases
    attention_bias: bool = False
    gated_norm: str = "none"  # MixerSpec.gated_norm, from mamba_rms_norm / mamba_norm_before_gate
    rope_theta: float = 1e11
    # µP multipliers, where transformers applies them (block.py folds all but the embedding's
    # into weights): the embedding rows, the logits, each branch's input and output, the keys,
    # the MLP's gate and down projections, in_proj's five output segments (SSM_SEGMENTS).
    embedding_multiplier: float = 1.0
    lm_head_multiplier: float = 1.0
    attention_in_multiplier: float = 1.0
    attention_out_multiplier: float = 1.0
    key_multiplier: float = 1.0
    ssm_in_multiplier: float = 1.0
    ssm_out_multiplier: float = 1.0
    mlp_multipliers: tuple[float, float] = (1.0, 1.0)  # gate, down
    ssm_multipliers: tuple[float, ...] = (1.0,) * 5
    norm_eps: float = 1e-5  # every RMSNorm, the mixer's gated one included
    context: int = DEFAULT_CONTEXT  # positions the KV cache holds (--context)
    max_position_embeddings: int = MAX_CONTEXT

    def __post_init__(self):  # JSON lists read back equal
        object.__setattr__(self, "mlp_multipliers", tuple(self.mlp_multipliers))
        object.__setattr__(self, "ssm_multipliers", tuple(self.ssm_multipliers))

    @property
    def layer_types(self) -> tuple[str, ...]:
        return (HYBRID,) * self.num_hidden_layers

    @property
    def attention_layers(self) -> int:  # every layer has both states
        return self.num_hidden_layers

    @property
    def mamba_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def mixer(self) -> MixerSpec:
        return MixerSpec(self.mamba_heads, self.mamba_head_dim, self.state_size, self.n_groups, self.conv_kernel,
                         self.conv_bias, self.proj_bias, self.norm_eps, gated_norm=self.gated_norm)  # fmt: skip

    @property
    def attention(self) -> AttentionSpec:
        return AttentionSpec(self.num_heads, self.num_kv_heads, self.head_dim, rotary_dim=self.head_dim,
                             rope_theta=self.rope_theta, bias=self.attention_bias)  # fmt: skip

    @property
    def ssm_scale(self) -> list[float]:
        """ssm_in_multiplier times the µP vector, per in_proj output channel (z | x | B | C | dt)."""
        m, gn = self.mixer, self.n_groups * self.state_size
        sizes = (m.intermediate_size, m.intermediate_size, gn, gn, self.mamba_heads)
        return [self.ssm_in_multiplier * f for f, n in zip(self.ssm_multipliers, sizes) for _ in range(n)]

    def validate(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"Falcon-H1: {self.num_heads} heads do not divide into {self.num_kv_heads} kv heads")
        if len(self.mlp_multipliers) != 2 or len(self.ssm_multipliers) != len(SSM_SEGMENTS):
            raise CheckpointError(f"Falcon-H1: mlp_multipliers needs 2 values and ssm_multipliers {len(SSM_SEGMENTS)} "
                                  f"({'|'.join(SSM_SEGMENTS)}), got {len(self.mlp_multipliers)} and {len(self.ssm_multipliers)}")  # fmt: skip
        self.mixer.validate("Falcon-H1")

    def describe(self) -> str:
        return (f"(L={self.num_layers} attention + Mamba-2, H={self.hidden_size}, heads {self.num_heads}/"
                f"{self.num_kv_heads}x{self.head_dim}, F={self.intermediate_size}, mamba {self.mamba_heads}x"
                f"{self.mamba_head_dim} N={self.state_size} G={self.n_groups}, V={self.vocab_size})")  # fmt: skip


def _multipliers(r: ConfigReader, key: str, count: int) -> tuple[float, ...]:
    values = r.raw(key, None)
    if values is None:
        return (1.0,) * count  # transformers' default
    if not isinstance(values, (list, tuple)) or len(values) != count:
        raise CheckpointError(f"{r.origin}: config.json {key}={values!r} is not a list of {count} numbers")
    return tuple(ConfigReader({key: v}, r.origin, r.family).float(key) for v in values)


def from_transformers(cj: Mapping[str, Any], origin: str) -> tuple[FalconH1Config, bool]:
    """(config, tied) from a FalconH1Config config.json; missing keys take transformers' defaults."""
    r = ConfigReader(cj, origin, "Falcon-H1")
    max_positions = max_positions_from(r)
    r.refuse({f"hidden_act={cj.get('hidden_act')!r}": cj.get("hidden_act", "silu") != "silu",
              "mlp_bias=true (the MLP has no biases here)": r.bool("mlp_bias", False),
              "projectors_bias != mamba_proj_bias (out_proj and in_proj biases differ)":
                  r.bool("projectors_bias", False) != r.bool("mamba_proj_bias", False)})  # fmt: skip
    refuse_dt_clamp(r, "time_step_limit", "transformers clamps dt with it in prompt processing only")
    hidden, heads = r.int("hidden_size", 4096), r.int("num_attention_heads", 32)
    mamba_heads = r.int("mamba_n_heads", 128)
    d_ssm = r.int("mamba_d_ssm", 1024) if r.raw("mamba_d_ssm", 1024) is not None else r.int("mamba_expand", 2) * hidden
    d_head = d_ssm // mamba_heads if cj.get("mamba_d_head", "auto") == "auto" else r.int("mamba_d_head")
    if mamba_heads * d_head != d_ssm:
        raise CheckpointError(f"{origin}: mamba_n_heads*mamba_d_head ({mamba_heads}*{d_head}) != mamba_d_ssm ({d_ssm})")
    norm = ("norm_first" if r.bool("mamba_norm_before_gate", True) else "gate_first") if r.bool("mamba_rms_norm", False) else "none"
    cfg = FalconH1Config(
        vocab_size=r.int("vocab_size", 128000), hidden_size=hidden, num_hidden_layers=r.layers("num_hidden_layers", 32),
        num_heads=heads, num_kv_heads=r.int("num_key_value_heads", 8) if cj.get("num_key_value_heads", 8) is not None else heads,
        head_dim=r.int("head_dim", hidden // heads), intermediate_size=r.int("intermediate_size", 14336),
        mamba_heads=mamba_heads, mamba_head_dim=d_head, state_size=r.int("mamba_d_state", 256),
        n_groups=r.int("mamba_n_groups", 1), conv_kernel=r.int("mamba_d_conv", 4), conv_bias=r.bool("mamba_conv_bias", True),
        proj_bias=r.bool("mamba_proj_bias", False), attention_bias=r.bool("attention_bias", False), gated_norm=norm,
        rope_theta=rope_theta(r, 10000.0), embedding_multiplier=r.float("embedding_multiplier", 1.0),
        lm_head_multiplier=r.float("lm_head_multiplier", 1.0), attention_in_multiplier=r.float("attention_in_multiplier", 1.0),
        attention_out_multiplier=r.float("attention_out_multiplier", 1.0), key_multiplier=r.float("key_multiplier", 1.0),
        ssm_in_multiplier=r.float("ssm_in_multiplier", 1.0), ssm_out_multiplier=r.float("ssm_out_multiplier", 1.0),
        mlp_multipliers=_multipliers(r, "mlp_multipliers", 2), ssm_multipliers=_multipliers(r, "ssm_multipliers", 5),
        norm_eps=r.float("rms_norm_eps", 1e-5, positive=True), context=min(DEFAULT_CONTEXT, max_positions),
        max_position_embeddings=max_positions,
    )  # fmt: skip
    return cfg, r.bool("tie_word_embeddings", False)


# Falcon-H1-0.5B (Base and Instruct share the architecture): every value from two third-party
# copies of its config.json (mlx-lm's falcon_h1 ModelArgs defaults, Megatron-Bridge's
# FalconH1ModelProvider500M); not checked against the Hub here.
_0_5B = {"vocab_size": 32784, "hidden_size": 1024, "num_hidden_layers": 36, "num_heads": 8, "num_kv_heads": 2,
         "head_dim": 64, "intermediate_size": 2048, "mamba_heads": 24, "mamba_head_dim": 64, "state_size": 128,
         "n_groups": 1, "gated_norm": "none", "rope_theta": 1e11, "embedding_multiplier": 5.656854249492381,
         "lm_head_multiplier": 0.0390625, "attention_out_multiplier": 0.9375, "key_multiplier": 0.390625,
         "ssm_in_multiplier": 1.25, "ssm_out_multiplier": 0.23570226039551587,
         "mlp_multipliers": [0.8838834764831844, 0.5859375],
         "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738]}  # fmt: skip
_CONFIRMED = "named by third-party copies of its config.json (mlx-lm, Megatron-Bridge); not fetched here"
# The larger sizes: layers, widths, heads, MLP, mamba heads / groups, d_state, vocab, the mamba
# RMSNorm and the µP multipliers from Megatron-Bridge's FalconH1ModelProvider{1P5BDeep,7B,34B}
# ("from config.json"); attention head_dim 128 from transformers' Falcon-H1 doc table; the 7B's
# head_dim, rope_theta 1e11 and mamba_norm_before_gate=false also from a third-party copy of its
# config.json. rope_theta and norm_before_gate for 1.5B-Deep and 34B are the 7B's (unconfirmed).
_SSM_LARGE = [0.3535533905932738, 0.25, 0.1767766952966369, 0.5, 0.3535533905932738]
_LARGE = {"head_dim": 128, "state_size": 256, "gated_norm": "gate_first", "rope_theta": 1e11,
          "embedding_multiplier": 5.656854249492381, "ssm_multipliers": _SSM_LARGE}  # fmt: skip
_1_5B_DEEP = _LARGE | {
    "vocab_size": 65537, "hidden_size": 1280, "num_hidden_layers": 66, "num_heads": 6, "num_kv_heads": 2,
    "intermediate_size": 3072, "mamba_heads": 24, "mamba_head_dim": 64, "n_groups": 1, "lm_head_multiplier": 0.03125,
    "attention_out_multiplier": 0.5, "key_multiplier": 0.17677669529663687, "ssm_in_multiplier": 1.0,
    "ssm_out_multiplier": 0.23570226039551587, "mlp_multipliers": [0.7071067811865476, 0.3125]}  # fmt: skip
# 1.5B (not Deep): its shape from a third-party copy of its config.json and transformers' doc
# table; its multipliers were in no copy found: the 1.5B-Deep's (unconfirmed, --synthetic only:
# a download reads the checkpoint's own config.json).
_1_5B = _1_5B_DEEP | {"hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 8, "intermediate_size": 4608,
                      "mamba_heads": 48}  # fmt: skip
_7B = _LARGE | {
    "vocab_size": 130049, "hidden_size": 3072, "num_hidden_layers": 44, "num_heads": 12, "num_kv_heads": 2,
    "intermediate_size": 12288, "mamba_heads": 24, "mamba_head_dim": 128, "n_groups": 1,
    "lm_head_multiplier": 0.013020833333333334, "attention_out_multiplier": 0.10416666666666667,
    "key_multiplier": 0.030690398488999456, "ssm_in_multiplier": 0.4166666666666667,
    "ssm_out_multiplier": 0.11785113019775793, "mlp_multipliers": [0.2946278254943948, 0.032552083333333336]}  # fmt: skip
_34B = _LARGE | {
    "vocab_size": 261120, "hidden_size": 5120, "num_hidden_layers": 72, "num_heads": 20, "num_kv_heads": 4,
    "intermediate_size": 21504, "mamba_heads": 32, "mamba_head_dim": 128, "n_groups": 2, "lm_head_multiplier": 0.0078125,
    "attention_out_multiplier": 0.0375, "key_multiplier": 0.011048543456039804, "ssm_in_multiplier": 0.25,
    "ssm_out_multiplier": 0.08838834764831845, "mlp_multipliers": [0.1767766952966369, 0.011160714285714284]}  # fmt: skip
_BRIDGE = "named by third-party lists of the Falcon-H1 checkpoints (Megatron-Bridge names the Instruct repo); not fetched here"
_LARGER = (  # (preset stem, config, description, how the repo is named, Hub stem)
    ("1.5b", _1_5B, "24 layers, H2048, 8/2 heads of 128, MLP 4608, mamba 48x64 N256; multipliers and mamba "
     "norm unconfirmed: the 1.5B-Deep's", _BRIDGE, "1.5B"),
    ("1.5b-deep", _1_5B_DEEP, "66 layers, H1280, 6/2 heads of 128, MLP 3072, mamba 24x64 N256", _BRIDGE, "1.5B-Deep"),
    ("7b", _7B, "44 layers, H3072, 12/2 heads of 128, MLP 12288, mamba 24x128 N256", _BRIDGE, "7B"),
    ("34b", _34B, "72 layers, H5120, 20/4 heads of 128, MLP 21504, mamba 32x128 N256 G2", _BRIDGE, "34B"),
)  # fmt: skip
# Falcon-H1-3B is left out: its MLP width and vocabulary were in no copy found.

PRESETS = (
    Preset("falcon-h1-0.5b-base", "falcon_h1", _0_5B,
           "TII Falcon-H1-0.5B-Base (36 layers of attention + Mamba-2, H1024, 8/2 heads of 64, MLP 2048, "
           "mamba 24x64 N128, untied)", True, HubSource("tiiuae/Falcon-H1-0.5B-Base", confirmed=_CONFIRMED)),
    Preset("falcon-h1-0.5b-instruct", "falcon_h1", _0_5B,
           "TII Falcon-H1-0.5B-Instruct (the Base architecture, instruction-tuned; chat template passed through)",
           True, HubSource("tiiuae/Falcon-H1-0.5B-Instruct", confirmed=_CONFIRMED)),
    *(Preset(f"falcon-h1-{stem}-{kind.lower()}", "falcon_h1", config, f"TII Falcon-H1-{hub}-{kind} ({what}; untied)",
             True, HubSource(f"tiiuae/Falcon-H1-{hub}-{kind}", confirmed=how))
      for stem, config, what, how, hub in _LARGER for kind in ("Base", "Instruct")),
    Preset("falcon-h1-tiny", "falcon_h1",
           {"vocab_size": 512, "hidden_size": 128, "num_hidden_layers": 3, "num_heads": 4, "num_kv_heads": 2,
            "head_dim": 24, "intermediate_size": 192, "mamba_heads": 6, "mamba_head_dim": 16, "state_size": 24,
            "n_groups": 2, "gated_norm": "gate_first", "rope_theta": 10000.0,
            **{k: v for k, v in _0_5B.items() if k.endswith(("multiplier", "multipliers"))}, "context": 64},
           "test model: 3 layers, H128, 4/2 heads of 24, mamba 6x16 (d_ssm 96) N24 G2, the 0.5B's multipliers, "
           "synthetic weights from a fixed seed", released=False),
)  # fmt: skip
