"""Qwen3.5 (`qwen3_5`, `qwen3_5_text`) config, read from config.json as transformers 5.24 reads
it (docs/hybrids.md, section 1), and the presets of the released dense sizes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from ssmport.architectures.base import HubSource, Preset
from ssmport.errors import CheckpointError
from ssmport.models import hybrid
from ssmport.models.hybrid import DEFAULT_CONTEXT, MAX_CONTEXT, check_context
from ssmport.models.layers.attention import AttentionSpec
from ssmport.models.layers.delta_rule import DeltaRuleSpec
from ssmport.models.loading import ConfigReader, refuse

LINEAR, FULL = "linear_attention", "full_attention"  # transformers' kinds, as models/hybrid.py spells them
ZERO_CENTRED = "rms_offset"  # Qwen3.5's RMSNorms: x / rms(x) * (1 + w)
# The KV cache's positions unless --context says otherwise: DEFAULT_CONTEXT (4096, shared with
# the other hybrids) keeps the cache of every released size phone-sized (fp32 state: 0.8B
# 96 MiB, 9B 256 MiB; half that in fp16) and the decode cost of reading it small next to the
# weights' (every step attends over the whole buffer, masked); the released
# max_position_embeddings (262144) would be 6-16 GiB.

# Qwen3_5TextConfig's defaults in transformers 5.24: a key missing from config.json takes these.
TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "hidden_act": "silu",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "full_attention_interval": 4,
}  # fmt: skip
ROPE_DEFAULTS: dict[str, Any] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}


@dataclass(frozen=True)
class Qwen35Config(hybrid.HybridConfig):
    vocab_size: int
    hidden_size: int  # C
    intermediate_size: int  # F of the SwiGLU MLP
    layer_types: tuple[str, ...]  # per layer: "linear_attention" (Gated DeltaNet) | "full_attention"
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    rotary_dim: int = 64  # int(head_dim * partial_rotary_factor): the dims RoPE rotates
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 262144
    context: int = DEFAULT_CONTEXT  # positions the KV cache holds (set at export: --context)
    # multi-token-prediction layers loaded (`mtp.*`, ssmport.models.qwen3_5.mtp): 0, or 1 when the
    # checkpoint has them and its config.json says mtp_num_hidden_layers >= 1
    mtp_layers: int = 0

    @property
    def attention(self) -> AttentionSpec:
        """Gated attention: q/k zero-centred RMSNorm per head, partial RoPE, o * sigmoid(gate)."""
        return AttentionSpec(self.num_attention_heads, self.num_key_value_heads, self.head_dim, rotary_dim=self.rotary_dim,
                             rope_theta=self.rope_theta, qk_norm=ZERO_CENTRED, norm_eps=self.rms_norm_eps,
                             output_gate=True, bias=self.attention_bias)  # fmt: skip

    @property
    def delta_rule(self) -> DeltaRuleSpec:
        return DeltaRuleSpec(self.linear_num_key_heads, self.linear_num_value_heads, self.linear_key_head_dim,
                             self.linear_value_head_dim, self.linear_conv_kernel_dim, norm_eps=self.rms_norm_eps)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        data = asdict(self) | {"layer_types": list(self.layer_types)}
        if not self.mtp_layers:  # a bundle without the head records the config it always did
            del data["mtp_layers"]
        return data

    def validate(self, origin: str) -> None:
        problems = hybrid.delta_rule_hybrid_problems(self) | {
            f"layer_types {sorted(set(self.layer_types) - {LINEAR, FULL})}": bool(set(self.layer_types) - {LINEAR, FULL}),
            "no full_attention layer (ssmport's Qwen3.5 needs both kinds)": FULL not in self.layer_types,
            "no linear_attention layer (ssmport's Qwen3.5 needs both kinds)": LINEAR not in self.layer_types,
            f"a rotary dim of {self.rotary_dim} (head_dim {self.head_dim} x partial_rotary_factor): it must be even "
            "and at most head_dim": self.rotary_dim % 2 or not 0 <= self.rotary_dim <= self.head_dim,
        }  # fmt: skip
        refuse(origin, "Qwen3.5", problems)
        check_context(self.context, self.max_position_embeddings)

    def describe(self) -> str:
        return (f"(L={self.num_layers}: {self.layers_of(LINEAR)} linear + {self.attention_layers} full, C={self.hidden_size}, "
                f"heads {self.num_attention_heads}/{self.num_key_value_heads}x{self.head_dim}, linear "
                f"{self.linear_num_key_heads}x{self.linear_key_head_dim}/{self.linear_num_value_heads}x"
                f"{self.linear_value_head_dim}, V={self.vocab_size})")  # fmt: skip


# --------------------------------------------------------------------------- config.json


def from_hf(cj: Mapping[str, Any], origin: str, experts: bool = False) -> Qwen35Config:
    """A `qwen3_5_text` config, or the `text_config` of a `qwen3_5` (VLM-packaged) one."""
    if cj.get("model_type") == "qwen3_5" or "text_config" in cj:
        text = cj.get("text_config")
        if not isinstance(text, Mapping):
            raise CheckpointError(f"{origin}: Qwen3.5 config.json has no text_config object")
        # Qwen3_5ForConditionalGeneration ties the head by the top-level key (docs/hybrids.md).
        tied = ConfigReader(cj, origin, "Qwen3.5").bool("tie_word_embeddings", False)
        if "tie_word_embeddings" in text and text["tie_word_embeddings"] != tied:
            raise CheckpointError(f"{origin}: config.json tie_word_embeddings={tied} but text_config says "
                                  f"{text['tie_word_embeddings']}: which head to use is ambiguous")  # fmt: skip
        return _from_text(text, f"{origin} (text_config)", tied, experts)
    return _from_text(cj, origin, None, experts)


def _from_text(cj: Mapping[str, Any], origin: str, tied: bool | None, experts: bool) -> Qwen35Config:
    """`experts`: Qwen3.5-MoE's reader (ssmport.models.qwen3_5_moe) reads the MoE keys itself."""
    r = ConfigReader(cj, origin, "Qwen3.5", TEXT_DEFAULTS)
    r.refuse({
        f"hidden_act={r.raw('hidden_act')!r}": r.raw("hidden_act") != "silu",
        "attn_output_gate=false (the attention without its output gate)": cj.get("attn_output_gate", True) is not True,
        f"mlp_only_layers={cj.get('mlp_only_layers')!r}": bool(cj.get("mlp_only_layers")),
        f"rope_scaling={cj.get('rope_scaling')!r}": cj.get("rope_scaling") is not None,
        "routed experts (num_experts; a Qwen3.5-MoE config)": bool(cj.get("num_experts")) and not experts,
    })  # fmt: skip
    layers = r.layers("num_hidden_layers")
    types = _layer_types(cj, r, layers)
    heads, head_dim = r.int("num_attention_heads"), r.int("head_dim")
    theta, partial = _rope(cj, r)
    cfg = Qwen35Config(
        vocab_size=r.int("vocab_size"), hidden_size=r.int("hidden_size"), intermediate_size=r.int("intermediate_size"),
        layer_types=types, num_attention_heads=heads, num_key_value_heads=r.int("num_key_value_heads"),
        head_dim=head_dim, linear_num_key_heads=r.int("linear_num_key_heads"),
        linear_num_value_heads=r.int("linear_num_value_heads"), linear_key_head_dim=r.int("linear_key_head_dim"),
        linear_value_head_dim=r.int("linear_value_head_dim"), linear_conv_kernel_dim=r.int("linear_conv_kernel_dim"),
        rotary_dim=int(head_dim * partial), rope_theta=theta, rms_norm_eps=r.float("rms_norm_eps", positive=True),
        attention_bias=r.bool("attention_bias"), tie_word_embeddings=r.bool("tie_word_embeddings") if tied is None else tied,
        max_position_embeddings=r.int("max_position_embeddings", hi=MAX_CONTEXT * 16),
    )  # fmt: skip
    cfg = replace(cfg, context=min(DEFAULT_CONTEXT, cfg.max_position_embeddings))
    cfg.validate(origin)
    return cfg


def _layer_types(cj: Mapping[str, Any], r: ConfigReader, layers: int) -> tuple[str, ...]:
    """`layer_types`, or (absent) transformers' rule: layer i is full attention iff (i+1) % interval == 0."""
    types = cj.get("layer_types")
    if types is None:
        interval = r.int("full_attention_interval", hi=layers)
        return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers))
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise CheckpointError(f"{r.origin}: config.json layer_types={types!r} is not a list of layer kinds")
    unknown = sorted(set(types) - {LINEAR, FULL})
    if unknown:
        raise r.unsupported(f"layer_types {unknown} (only {LINEAR!r} and {FULL!r})")
    if len(types) != layers:
        raise CheckpointError(f"{r.origin}: config.json layer_types has {len(types)} entries, num_hidden_layers={layers}")
    return tuple(types)


def _rope(cj: Mapping[str, Any], r: ConfigReader) -> tuple[float, float]:
    """(theta, partial_rotary_factor). mRoPE's `mrope_section` / `mrope_interleaved` are
    checked for shape only: with text alone all three position rows are the token's position,
    so any sections give plain partial RoPE (tests/test_qwen35.py pins this against transformers)."""
    params = cj.get("rope_parameters")
    if params is None:
        params = {k: cj[k] for k in ("rope_theta", "partial_rotary_factor") if k in cj}
    if not isinstance(params, Mapping):
        raise CheckpointError(f"{r.origin}: config.json rope_parameters={params!r} is not an object")
    top = cj.get("partial_rotary_factor")
    if top is not None and "partial_rotary_factor" in params and params["partial_rotary_factor"] != top:
        raise CheckpointError(f"{r.origin}: config.json partial_rotary_factor={top} but rope_parameters says "
                              f"{params['partial_rotary_factor']}")  # fmt: skip
    if top is not None:
        params = {**params, "partial_rotary_factor": top}
    p = ConfigReader(params, f"{r.origin} rope_parameters", "Qwen3.5", ROPE_DEFAULTS)
    p.refuse({f"rope_type={p.raw('rope_type')!r} (it rescales the frequencies)": p.raw("rope_type") != "default"})
    section = params.get("mrope_section")
    if section is not None and not (isinstance(section, list) and len(section) == 3 and
                                    all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in section)):  # fmt: skip
        raise CheckpointError(f"{r.origin}: config.json mrope_section={section!r} is not three whole numbers")
    if not isinstance(params.get("mrope_interleaved", True), bool):
        raise CheckpointError(f"{r.origin}: config.json mrope_interleaved={params['mrope_interleaved']!r} is not true or false")
    partial = p.float("partial_rotary_factor")
    if not 0 <= partial <= 1:
        raise CheckpointError(f"{r.origin}: config.json partial_rotary_factor={partial} is outside [0, 1]")
    return p.float("rope_theta", positive=True), partial


# --------------------------------------------------------------------------- presets

# Every released size shares these (docs/hybrids.md, section 5): 3 linear + 1 full layers
# repeated, 256-wide attention heads with a quarter of them rotated, 128-wide linear heads.
_COMMON = {"vocab_size": 248320, "head_dim": 256, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
           "linear_conv_kernel_dim": 4, "rotary_dim": 64, "rope_theta": 10_000_000.0, "rms_norm_eps": 1e-6,
           "max_position_embeddings": 262144, "context": DEFAULT_CONTEXT}  # fmt: skip


def _pattern(layers: int) -> list[str]:
    return [FULL if (i + 1) % 4 == 0 else LINEAR for i in range(layers)]


_CONFIRMED = "the released config.json and model card (copies in public repos; docs/hybrids.md, section 5)"
_CARDS = "model card copies in public repos (docs/hybrids.md, section 5)"
_RELEASES = (  # (size, layers, hidden, ffn, heads, kv heads, linear k heads, linear v heads, tied, how confirmed)
    ("0.8b", 24, 1024, 3584, 8, 2, 16, 16, True, _CONFIRMED),
    ("2b", 24, 2048, 6144, 8, 2, 16, 16, True, _CONFIRMED),
    ("4b", 32, 2560, 9216, 16, 4, 16, 32, True, _CARDS),
    # The 9B's untied head is from Apple's exporter's comment, not seen on its card (unconfirmed).
    ("9b", 32, 4096, 12288, 16, 4, 16, 32, False, _CARDS + "; the untied head is unconfirmed"),
)  # fmt: skip

PRESETS = (
    *(Preset(f"qwen3.5-{size}", "qwen3_5",
             _COMMON | {"hidden_size": C, "intermediate_size": F, "layer_types": _pattern(L), "num_attention_heads": h,
                        "num_key_value_heads": kv, "linear_num_key_heads": lk, "linear_num_value_heads": lv,
                        "tie_word_embeddings": tied},
             f"Qwen3.5 {size.upper()} (L{L}: {L * 3 // 4} Gated DeltaNet + {L // 4} gated attention, C{C})", True,
             HubSource(f"Qwen/Qwen3.5-{size.upper()}", confirmed=how))
      for size, L, C, F, h, kv, lk, lv, tied, how in _RELEASES),
    Preset("qwen3.5-tiny", "qwen3_5",
           {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 96,
            "layer_types": [LINEAR, LINEAR, FULL, LINEAR, FULL], "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
            "linear_value_head_dim": 12, "linear_conv_kernel_dim": 4, "rotary_dim": 8, "rope_theta": 10000.0,
            "max_position_embeddings": 256, "context": 64},
           "test model: L5 (lin, lin, full, lin, full) C64, heads 4/2x16, linear 2x8 / 4x12, context 64", False),
)  # fmt: skip
