"""Gated DeltaNet config (fla's GatedDeltaNetConfig keys and defaults) and presets."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ssmport.architectures.base import FieldsConfig
from ssmport.architectures.base import Preset
from ssmport.errors import CheckpointError
from ssmport.models.loading import ConfigReader

# GatedDeltaNetConfig's defaults in fla: a key missing from config.json takes these.
FLA_DEFAULTS: dict[str, Any] = {
    "hidden_size": 2048, "expand_v": 2.0, "use_gate": True, "use_short_conv": True,
    "allow_neg_eigval": False, "conv_size": 4, "head_dim": 256, "num_heads": 6, "num_v_heads": None,
    "hidden_ratio": 4, "intermediate_size": None, "hidden_act": "swish", "num_hidden_layers": 21,
    "norm_eps": 1e-6, "vocab_size": 32000, "tie_word_embeddings": False,
}  # fmt: skip


@dataclass(frozen=True)
class GatedDeltaNetConfig(FieldsConfig):
    vocab_size: int
    hidden_size: int  # C
    num_layers: int  # L
    num_heads: int  # H: query/key heads
    head_dim: int  # dk
    num_v_heads: int  # HV: value heads, a multiple of H
    head_v_dim: int  # dv = head_dim * expand_v
    intermediate_size: int  # F of the SwiGLU MLP
    conv_size: int = 4  # W of the depthwise causal convs
    conv_bias: bool = False
    use_gate: bool = True  # output gate silu(x W_g) after the head-wise RMSNorm
    allow_neg_eigval: bool = False  # beta in (0, 2) instead of (0, 1)
    norm_eps: float = 1e-6

    @property
    def key_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:  # channels of the three short convs, in q | k | v order
        return 2 * self.key_dim + self.value_dim

    @property
    def group(self) -> int:  # value heads per query/key head
        return self.num_v_heads // self.num_heads

    def validate(self) -> None:
        if self.num_v_heads % self.num_heads:
            raise CheckpointError(f"num_v_heads={self.num_v_heads} is not a multiple of num_heads={self.num_heads}")
        if self.conv_size < 2:
            raise CheckpointError(f"conv_size={self.conv_size}: the short convolution needs a kernel of at least 2")

    def describe(self) -> str:
        return (f"(L={self.num_layers} C={self.hidden_size} H={self.num_heads}x{self.head_dim} "
                f"HV={self.num_v_heads}x{self.head_v_dim} V={self.vocab_size})")  # fmt: skip


def fla_mlp_size(hidden: int, ratio: float | None) -> int:
    """fla's GatedMLP: 2/3 of hidden * ratio, rounded up to a multiple of 256."""
    size = int(hidden * (ratio or 4) * 2 / 3)
    return 256 * ((size + 255) // 256)


# fla/flame's published training configs (configs/gated_deltanet_{340M,1B}.json): 21 layers,
# 6 heads of 256, expand_v 2, Llama-2 vocab; the "1B" config is the 1.3B of the GDN paper.
# No Hub release of exactly these configs was found, so they have no download source (pass
# --weights). The published GDN checkpoints found (m-a-p/1.3B-100B-GatedDeltaNet-pure,
# m-a-p/340M-20B-GatedDeltaNet-pure-baseline, linear-moe-hub/Gated-Deltanet-{340M,1.3B}) have
# other shapes; `ssmport export ORG/REPO` reads theirs from config.json.
def _preset(name: str, description: str, released: bool, **config) -> Preset:
    return Preset(name, "gated_deltanet", config, description, released)


PRESETS = (
    *(_preset(f"gated-deltanet-{size}", f"fla Gated DeltaNet {size.upper()} (L21 C{width}, 6x256 heads, dv 512)", True,
              vocab_size=32000, hidden_size=width, num_layers=21, num_heads=6, head_dim=256, num_v_heads=6,
              head_v_dim=512, intermediate_size=fla_mlp_size(width, 4)) for size, width in (("340m", 1024), ("1.3b", 2048))),
    _preset("gated-deltanet-tiny", "test model: L2 C128, 2 q/k heads of 32, 4 value heads of 48 (GVA, dv != dk)",
            False, vocab_size=512, hidden_size=128, num_layers=2, num_heads=2, head_dim=32, num_v_heads=4,
            head_v_dim=48, intermediate_size=256),
)  # fmt: skip


def from_fla(cj: Mapping[str, Any], origin: str, embedding_rows: int | None, conv_bias: bool) -> GatedDeltaNetConfig:
    """fla's config.json; a missing key (or a null, where fla means "default") takes fla's default."""
    given = {k: v for k, v in cj.items() if v is not None or k in ("num_v_heads", "intermediate_size")}
    r = ConfigReader(given, origin, "Gated DeltaNet", FLA_DEFAULTS)
    r.refuse({"hybrid attention layers ('attn')": cj.get("attn") not in (None, {}),
              "attention residuals ('attnres_block_size')": cj.get("attnres_block_size") is not None,
              f"hidden_act={r.raw('hidden_act')!r}": r.raw("hidden_act") != "swish",
              "use_short_conv=false": not r.raw("use_short_conv")})  # fmt: skip
    width, head_dim, heads = r.int("hidden_size"), r.int("head_dim"), r.int("num_heads")
    v_heads = r.int("num_v_heads") if r.raw("num_v_heads") is not None else heads
    expand_v = r.float("expand_v", positive=True)
    if not math.isclose(head_dim * expand_v, round(head_dim * expand_v), rel_tol=1e-5):
        raise CheckpointError(f"{origin}: expand_v={expand_v} gives a fractional value head size")
    head_v_dim = r.size("head_dim*expand_v", round(head_dim * expand_v))
    ffn = r.int("intermediate_size") if r.raw("intermediate_size") is not None else \
        r.size("hidden_size*hidden_ratio", fla_mlp_size(width, r.float("hidden_ratio", positive=True)))
    vocab = r.int("vocab_size") if "vocab_size" in cj else (embedding_rows or FLA_DEFAULTS["vocab_size"])
    return GatedDeltaNetConfig(
        vocab_size=vocab, hidden_size=width, num_layers=r.layers("num_hidden_layers"), num_heads=heads,
        head_dim=head_dim, num_v_heads=v_heads, head_v_dim=head_v_dim, intermediate_size=ffn,
        conv_size=r.int("conv_size"), conv_bias=conv_bias, use_gate=r.bool("use_gate"),
        allow_neg_eigval=r.bool("allow_neg_eigval"), norm_eps=r.float("norm_eps", positive=True),
    )  # fmt: skip
