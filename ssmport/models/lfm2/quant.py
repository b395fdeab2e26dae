"""Which LFM2 weights stay float under int8keepproj (benchmarks/hybrid_quant_predicate.py)."""

from __future__ import annotations

from ssmport.quant.roles import Role


def role(name: str) -> Role:
    """Plan category of a canonical weight name (fused names like `{...q_proj...,...v_proj...}` too)."""
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return Role.EMBEDDING if name == "model.embed_tokens.weight" else Role.HEAD
    if ".feed_forward." in name:
        return Role.FFN
    if ".self_attn." in name and "_proj." in name:
        return Role.ATTN_PROJ
    if ".conv.in_proj." in name:
        return Role.STATE_PROJ  # B, C and x: what the conv state keeps is B * x
    if ".conv.out_proj." in name:
        return Role.OUT_PROJ
    if ".conv.conv." in name:
        return Role.CONV
    return Role.NORM


KEEP_FLOAT_ROLES = frozenset({Role.STATE_PROJ, Role.CONV, Role.NORM, Role.EMBEDDING})
