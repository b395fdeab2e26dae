"""OLMo-Hybrid (`olmo_hybrid`) config, read from config.json as transformers 5.24's
`OlmoHybridConfig` reads it (docs/hybrids.md, section 7), and the presets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from ssmport.architectures.base import HubSource, Preset
from ssmport.errors import CheckpointError
from ssmport.models import hybrid
from ssmport.models.hybrid import DEFAULT_CONTEXT, MAX_CONTEXT, check_context, layer_kinds, rope_theta
from ssmport.models.layers.attention import AttentionSpec
from ssmport.models.layers.delta_rule import DeltaRuleSpec
from ssmport.models.loading import ConfigReader, refuse

LINEAR, FULL = hybrid.MAMBA, hybrid.ATTENTION  # "linear_attention" (Gated DeltaNet), "full_attention"
GATED_NORM_EPS = 1e-5  # the Gated DeltaNet output norm's eps: fixed in transformers (fla's default), not rms_norm_eps

# OlmoHybridConfig's defaults in transformers 5.24 (a key missing from config.json takes these;
# the linear-attention widths and num_key_value_heads default from other keys, in `from_hf`).
DEFAULTS: dict[str, Any] = {
    "vocab_size": 100352, "hidden_size": 3840, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 30, "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "attention_bias": False, "linear_conv_kernel_dim": 4,
    "linear_allow_neg_eigval": True,
}  # fmt: skip


@dataclass(frozen=True)
class OlmoHybridConfig(hybrid.HybridConfig):
    vocab_size: int
    hidden_size: int  # C
    intermediate_size: int  # F of the SwiGLU MLP
    layer_types: tuple[str, ...]  # per layer: "linear_attention" | "full_attention"
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    linear_allow_neg_eigval: bool = True  # beta = 2 sigmoid(.) in (0, 2): the state may flip sign along k
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 65536
    context: int = DEFAULT_CONTEXT  # positions the KV cache holds (set at export: --context)

    @property
    def attention(self) -> AttentionSpec:
        """OLMo-2/3 attention: one RMSNorm over all of q (and all of k) before RoPE, full rotate-half RoPE."""
        return AttentionSpec(self.num_attention_heads, self.num_key_value_heads, self.head_dim, rotary_dim=self.head_dim,
                             rope_theta=self.rope_theta, qk_norm="rms", qk_norm_per_head=False,
                             norm_eps=self.rms_norm_eps, bias=self.attention_bias)  # fmt: skip

    @property
    def delta_rule(self) -> DeltaRuleSpec:
        return DeltaRuleSpec(self.linear_num_key_heads, self.linear_num_value_heads, self.linear_key_head_dim,
                             self.linear_value_head_dim, self.linear_conv_kernel_dim,
                             allow_neg_eigval=self.linear_allow_neg_eigval, norm_eps=GATED_NORM_EPS)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"layer_types": list(self.layer_types)}

    def validate(self, origin: str) -> None:
        kinds = set(self.layer_types)
        refuse(origin, "OLMo-Hybrid", hybrid.delta_rule_hybrid_problems(self) | {
            f"layer_types {sorted(kinds - {LINEAR, FULL})}": bool(kinds - {LINEAR, FULL}),
            "no full_attention layer (transformers refuses it too)": FULL not in kinds,
            "no linear_attention layer (transformers refuses it too)": LINEAR not in kinds,
            f"head_dim={self.head_dim} (RoPE rotates pairs: it must be even)": self.head_dim % 2 != 0,
        })  # fmt: skip
        check_context(self.context, self.max_position_embeddings)

    def describe(self) -> str:
        return (f"(L={self.num_layers}: {self.layers_of(LINEAR)} linear + {self.attention_layers} full, C={self.hidden_size}, "
                f"heads {self.num_attention_heads}/{self.num_key_value_heads}x{self.head_dim}, linear "
                f"{self.linear_num_key_heads}x{self.linear_key_head_dim}/{self.linear_num_value_heads}x"
                f"{self.linear_value_head_dim}, V={self.vocab_size})")  # fmt: skip


def from_hf(cj: Mapping[str, Any], origin: str) -> OlmoHybridConfig:
    r = ConfigReader(cj, origin, "OLMo-Hybrid", DEFAULTS)
    r.refuse({f"hidden_act={r.raw('hidden_act')!r} (the MLP's and the short conv's activation)": r.raw("hidden_act") != "silu"})
    layers = r.layers("num_hidden_layers")
    types = cj.get("layer_types")
    types = _default_layer_types(layers) if types is None else layer_kinds(types, (LINEAR, FULL), r, "layer_types")
    if len(types) != layers:
        raise CheckpointError(f"{origin}: config.json layer_types has {len(types)} entries, num_hidden_layers={layers}")
    C, heads = r.int("hidden_size"), r.int("num_attention_heads")
    k_heads = _or(cj, r, "linear_num_key_heads", heads)
    k_dim = _or(cj, r, "linear_key_head_dim", int(0.75 * C / k_heads))
    cfg = OlmoHybridConfig(
        vocab_size=r.int("vocab_size"), hidden_size=C, intermediate_size=r.int("intermediate_size"), layer_types=types,
        num_attention_heads=heads, num_key_value_heads=_or(cj, r, "num_key_value_heads", heads),
        head_dim=_or(cj, r, "head_dim", C // heads), linear_num_key_heads=k_heads,
        linear_num_value_heads=_or(cj, r, "linear_num_value_heads", heads), linear_key_head_dim=k_dim,
        linear_value_head_dim=_or(cj, r, "linear_value_head_dim", 2 * k_dim),
        linear_conv_kernel_dim=r.int("linear_conv_kernel_dim"),
        linear_allow_neg_eigval=r.bool("linear_allow_neg_eigval"),
        # rope_parameters absent or null: transformers 5.24 still builds RoPE with theta 10000
        # (docs/hybrids.md, section 7), so NoPE is never what it runs.
        rope_theta=rope_theta(r, 10000.0), rms_norm_eps=r.float("rms_norm_eps", positive=True),
        attention_bias=r.bool("attention_bias"), tie_word_embeddings=r.bool("tie_word_embeddings"),
        max_position_embeddings=r.int("max_position_embeddings", hi=MAX_CONTEXT * 16),
    )  # fmt: skip
    cfg = replace(cfg, context=min(DEFAULT_CONTEXT, cfg.max_position_embeddings))
    cfg.validate(origin)
    return cfg


def _or(cj: Mapping[str, Any], r: ConfigReader, key: str, default: int) -> int:
    """A width transformers derives from other keys when config.json has none (or null)."""
    return default if cj.get(key) is None else r.int(key)


def _default_layer_types(layers: int) -> tuple[str, ...]:
    """transformers' rule without layer_types: every 4th layer (i % 4 == 3) attends; if that
    leaves none (fewer than 4 layers), the last one does."""
    types = [FULL if i % 4 == 3 else LINEAR for i in range(layers)]
    if FULL not in types:
        types[-1] = FULL
    return tuple(types)


# --------------------------------------------------------------------------- presets

# OlmoHybridConfig's defaults in transformers 5.24 are the 7B's (its docstring names
# allenai/Olmo-Hybrid-7B): 32 layers, 3 Gated DeltaNet + 1 attention repeated, 30 heads of
# 128, linear heads 30 x 96 (keys) / 30 x 192 (values). The released config.json itself was not
# seen here: the preset is those defaults, unconfirmed field by field.
_7B = {"vocab_size": 100352, "hidden_size": 3840, "intermediate_size": 11008, "layer_types": list(_default_layer_types(32)),
       "num_attention_heads": 30, "num_key_value_heads": 30, "head_dim": 128, "linear_num_key_heads": 30,
       "linear_num_value_heads": 30, "linear_key_head_dim": 96, "linear_value_head_dim": 192,
       "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
       "tie_word_embeddings": False, "max_position_embeddings": 65536, "context": DEFAULT_CONTEXT}  # fmt: skip

PRESETS = (
    Preset("olmo-hybrid-7b", "olmo_hybrid", _7B, "OLMo-Hybrid 7B (L32: 24 Gated DeltaNet + 8 attention, C3840)", True,
           HubSource("allenai/Olmo-Hybrid-7B", confirmed="the Hub model page; config = transformers 5.24's "
                                                          "OlmoHybridConfig defaults (released config.json unconfirmed)")),
    Preset("olmo-hybrid-tiny", "olmo_hybrid",
           {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
            "layer_types": [LINEAR, LINEAR, FULL, LINEAR, FULL], "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
            "linear_value_head_dim": 12, "linear_conv_kernel_dim": 4, "max_position_embeddings": 256, "context": 64},
           "test model: L5 (lin, lin, full, lin, full) C64, heads 4/2x16, linear 2x8 / 4x12, context 64", False),
)  # fmt: skip
