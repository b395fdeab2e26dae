"""Gated DeltaNet weights: canonical names are fla's (nn.Linear [out, in], conv [D, 1, W])."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ssmport.loader.checkpoint import TensorSource
from ssmport.models.gated_deltanet.config import GatedDeltaNetConfig, from_fla
from ssmport.models.loading import ConfigReader, check_layer_count, checked_view, head_name


def layer(i: int) -> str:
    return f"model.layers.{i}."


def canonical_shapes(cfg: GatedDeltaNetConfig) -> dict[str, tuple[int, ...]]:
    C, Kd, Vd, HV, W, F_ = cfg.hidden_size, cfg.key_dim, cfg.value_dim, cfg.num_v_heads, cfg.conv_size, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embeddings.weight": (cfg.vocab_size, C)}
    for i in range(cfg.num_layers):
        p, a, m = layer(i), layer(i) + "attn.", layer(i) + "mlp."
        shapes |= {p + "attn_norm.weight": (C,), p + "mlp_norm.weight": (C,)}
        shapes |= {a + "q_proj.weight": (Kd, C), a + "k_proj.weight": (Kd, C), a + "v_proj.weight": (Vd, C),
                   a + "a_proj.weight": (HV, C), a + "b_proj.weight": (HV, C), a + "A_log": (HV,), a + "dt_bias": (HV,),
                   a + "o_norm.weight": (cfg.head_v_dim,), a + "o_proj.weight": (C, Vd)}  # fmt: skip
        for stream, width in (("q", Kd), ("k", Kd), ("v", Vd)):
            shapes[f"{a}{stream}_conv1d.weight"] = (width, 1, W)
            if cfg.conv_bias:
                shapes[f"{a}{stream}_conv1d.bias"] = (width,)
        if cfg.use_gate:
            shapes[a + "g_proj.weight"] = (Vd, C)
        shapes |= {m + "gate_proj.weight": (F_, C), m + "up_proj.weight": (F_, C), m + "down_proj.weight": (C, F_)}
    return shapes | {"model.norm.weight": (C,), "lm_head.weight": (cfg.vocab_size, C)}


def load_fla(cj: Mapping[str, Any], source: TensorSource) -> tuple[GatedDeltaNetConfig, TensorSource]:
    emb = "model.embeddings.weight"
    # fla's model never passes conv_bias to its layers; the weights say whether they have one.
    cfg = from_fla(cj, source.origin, source.shape(emb)[0] if emb in source else None,
                   conv_bias="model.layers.0.attn.q_conv1d.bias" in source)  # fmt: skip
    cfg.validate()
    check_layer_count(cfg.num_layers, source, "model.layers.", source.origin)
    tied = ConfigReader(cj, source.origin, "Gated DeltaNet").bool("tie_word_embeddings", False)
    # fla from 2024-12-20 to 2025-03-12 saved a per-head `attn.D` it never used (fla #226).
    unused = {f"{layer(i)}attn.D": (cfg.num_v_heads,) for i in range(cfg.num_layers)}
    return cfg, checked_view(source, canonical_shapes(cfg), {"lm_head.weight": head_name(tied, source, "lm_head.weight", emb)},
                             None, f"Gated DeltaNet {cfg.describe()} (fla layout)", optional=unused)  # fmt: skip
