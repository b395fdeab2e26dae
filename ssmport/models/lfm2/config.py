"""LFM2 / LFM2.5 config (transformers' Lfm2Config keys, both spellings released), presets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ssmport.architectures.base import HubSource, Preset
from ssmport.errors import CheckpointError
from ssmport.models.hybrid import (
    ATTENTION,
    CONV,
    DEFAULT_CONTEXT,
    MAX_CONTEXT,
    HybridConfig,
    layer_kinds,
    max_positions_from,
    rope_theta,
)
from ssmport.models.layers.attention import AttentionSpec
from ssmport.models.loading import ConfigReader

LAYER_KINDS = (CONV, ATTENTION)


@dataclass(frozen=True)
class Lfm2Config(HybridConfig):
    vocab_size: int
    hidden_size: int  # H
    layer_types: tuple[str, ...]  # per layer: "conv" (gated short conv) | "full_attention"
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # F: the SwiGLU width as built (after block_auto_adjust_ff_dim)
    conv_kernel: int = 3  # conv_L_cache: the short conv's taps, and the conv state's rows
    conv_bias: bool = False  # biases on the conv layers' in_proj, conv and out_proj
    norm_eps: float = 1e-5  # every RMSNorm, the q/k layernorms included
    rope_theta: float = 1e6
    context: int = DEFAULT_CONTEXT  # positions the KV cache holds (--context)
    max_position_embeddings: int = MAX_CONTEXT  # what the model was trained for: --context's bound

    @property
    def conv_layers(self) -> int:
        return self.layers_of(CONV)

    @property
    def attention(self) -> AttentionSpec:
        """q/k RMSNorm (plain gain) per head, then full rotate-half RoPE; scale head_dim^-0.5."""
        return AttentionSpec(self.num_heads, self.num_kv_heads, self.head_dim, rotary_dim=self.head_dim,
                             rope_theta=self.rope_theta, qk_norm="rms", norm_eps=self.norm_eps)  # fmt: skip

    def validate(self, family: str = "LFM2", kinds: tuple[str, ...] = LAYER_KINDS) -> None:
        """Known layer kinds, an even head_dim, a conv of 2 taps or more (LFM3 shares it)."""
        self.check_layers(family, kinds)
        if self.head_dim % 2:
            raise CheckpointError(f"{family}: head_dim {self.head_dim} is odd (RoPE rotates pairs)")
        if self.conv_kernel < 2:
            raise CheckpointError(f"{family}: conv_L_cache {self.conv_kernel} < 2 is not supported")

    def describe(self) -> str:
        return (f"(L={self.num_layers}: {self.conv_layers} conv + {self.attention_layers} attention, "
                f"H={self.hidden_size}, heads {self.num_heads}/{self.num_kv_heads}x{self.head_dim}, F={self.intermediate_size}, "
                f"V={self.vocab_size})")  # fmt: skip


def mlp_width(ff: int, auto_adjust: bool, multiplier: float | None, multiple_of: int) -> int:
    """Lfm2MLP's width: 2/3 of the configured one, then (only with a multiplier) scaled and
    rounded up to a multiple of `multiple_of`; without auto-adjust the configured one."""
    if not auto_adjust:
        return ff
    width = int(2 * ff / 3)
    if multiplier is not None:
        width = int(multiplier * width)
        width = multiple_of * ((width + multiple_of - 1) // multiple_of)
    return width


def from_transformers(cj: Mapping[str, Any], origin: str) -> tuple[Lfm2Config, bool]:
    """(config, tied) from an Lfm2Config config.json; missing keys take transformers' defaults."""
    r = ConfigReader(cj, origin, "LFM2")
    named = set(cj.get("architectures") or [])  # a folder that says lfm2 but names another class
    r.refuse({"experts (lfm2_moe: LFM2-8B-A1B and the like; only the dense LFM2/LFM2.5 models)":
                  bool(named & {"Lfm2MoeForCausalLM"}),
              "a vision tower (lfm2_vl; only the text models)": bool(named & {"Lfm2VlForConditionalGeneration"})})  # fmt: skip
    multiplier = r.raw("block_ffn_dim_multiplier", 1.0)
    width = mlp_width(r.int("block_ff_dim", r.int("intermediate_size", 12288)), r.bool("block_auto_adjust_ff_dim", True),
                      None if multiplier is None else r.float("block_ffn_dim_multiplier", positive=True),
                      r.int("block_multiple_of", 256))  # fmt: skip
    fields, tied = common_fields(r, cj)
    return Lfm2Config(**fields, intermediate_size=width), tied


def common_fields(r: ConfigReader, cj: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """What LFM2 and LFM2-MoE read alike: every Lfm2Config field but the MLP width, and `tied`."""
    origin, max_positions = r.origin, max_positions_from(r)
    hidden, layers = r.int("hidden_size", 2560), r.layers("num_hidden_layers", 32)
    for key in ("block_dim", "conv_dim"):  # carried by early releases, unread by transformers
        if key in cj and r.int(key) != hidden:
            raise r.unsupported(f"{key}={cj[key]} != hidden_size={hidden}")
    if "layer_types" in cj:
        kinds = layer_kinds(cj["layer_types"], LAYER_KINDS, r, "layer_types")
    else:  # the first releases name the attention layers; transformers' default is all attention
        idxs = r.raw("full_attn_idxs", None)
        idxs = list(range(layers)) if idxs is None else idxs
        if not isinstance(idxs, list) or not all(isinstance(i, int) and 0 <= i < layers for i in idxs):
            raise CheckpointError(f"{origin}: config.json full_attn_idxs={idxs!r} is not a list of layer indices")
        kinds = tuple(ATTENTION if i in idxs else CONV for i in range(layers))
    if len(kinds) != layers:
        raise CheckpointError(f"{origin}: config.json has {len(kinds)} layer_types for num_hidden_layers={layers}")
    heads = r.int("num_attention_heads", 32)
    tied = r.bool("tie_embedding", r.bool("tie_word_embeddings", True))  # the legacy key wins, as in transformers
    fields = dict(
        vocab_size=r.int("vocab_size", 65536), hidden_size=hidden, layer_types=kinds, num_heads=heads,
        num_kv_heads=r.int("num_key_value_heads", 8), head_dim=r.int("head_dim", hidden // heads),
        conv_kernel=r.int("conv_L_cache", 3), conv_bias=r.bool("conv_bias", False),
        norm_eps=r.float("norm_eps", 1e-5, positive=True), rope_theta=rope_theta(r, 1e6), context=min(DEFAULT_CONTEXT, max_positions), max_position_embeddings=max_positions,
    )  # fmt: skip
    return fields, tied


# The released dense models (docs/hybrids.md section 5). All: vocab 65536, conv_L_cache 3, no
# conv bias, norm eps 1e-5, rope theta 1e6, tied, 128000 max positions (the cards: 32k context).
_ATTN_16 = (2, 5, 8, 10, 12, 14)  # the 16-layer sizes' attention layers
_ATTN_30 = (2, 5, 9, 13, 17, 21, 24, 27)
_CARD = "model card (layer split, parameter count) + transformers' count of these values"


def _kinds(layers: int, attention: tuple[int, ...]) -> list[str]:
    return [ATTENTION if i in attention else CONV for i in range(layers)]


def _preset(name: str, repo: str, layers: int, attention: tuple[int, ...], hidden: int, heads: int, width: int,
            description: str, confirmed: str | None) -> Preset:  # fmt: skip
    config = {"vocab_size": 65536, "hidden_size": hidden, "layer_types": _kinds(layers, attention), "num_heads": heads,
              "num_kv_heads": 8, "head_dim": hidden // heads, "intermediate_size": width}  # fmt: skip
    return Preset(name, "lfm2", config, description, True, HubSource(repo, confirmed=confirmed))


PRESETS = (
    _preset("lfm2-350m", "LiquidAI/LFM2-350M", 16, _ATTN_16, 1024, 16, 4608,
            "LiquidAI LFM2-350M (16 layers: 10 conv + 6 attention, H1024, 16/8 heads, MLP 4608)", _CARD),
    _preset("lfm2-700m", "LiquidAI/LFM2-700M", 16, _ATTN_16, 1536, 24, 6912,
            "LiquidAI LFM2-700M (16 layers, H1536, MLP 6912; 24/8 heads unconfirmed)", _CARD),
    _preset("lfm2-1.2b", "LiquidAI/LFM2-1.2B", 16, _ATTN_16, 2048, 32, 8192,
            "LiquidAI LFM2-1.2B (16 layers: 10 conv + 6 attention, H2048, 32/8 heads, MLP 8192)",
            _CARD + "; a verbatim config copy"),
    _preset("lfm2-2.6b", "LiquidAI/LFM2-2.6B", 30, _ATTN_30, 2048, 32, 10752,
            "LiquidAI LFM2-2.6B (30 layers: 22 conv + 8 attention, H2048, MLP 10752; attention layers unconfirmed)",
            _CARD),
    _preset("lfm2.5-1.2b-instruct", "LiquidAI/LFM2.5-1.2B-Instruct", 16, _ATTN_16, 2048, 32, 8192,
            "LiquidAI LFM2.5-1.2B-Instruct (LFM2-1.2B's shape per third-party tests: unconfirmed)", None),
    Preset("lfm2-tiny", "lfm2",
           {"vocab_size": 512, "hidden_size": 128, "layer_types": [CONV, CONV, ATTENTION, CONV, ATTENTION],
            "num_heads": 4, "num_kv_heads": 2, "head_dim": 32, "intermediate_size": 256, "context": 64},
           "test model: 5 layers (conv, conv, attention, conv, attention), H128, 4/2 heads of 32, K3, "
           "synthetic weights from a fixed seed", released=False),
)  # fmt: skip
