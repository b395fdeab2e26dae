"""Which Granite-4.0-H weights stay float under int8keepproj (benchmarks/hybrid_quant_predicate.py)."""

from __future__ import annotations

from ssmport.quant.roles import Role


def role(name: str) -> Role:
    """Plan category of a canonical weight name (fused names like `{...q_proj...,...v_proj...}` too)."""
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return Role.EMBEDDING if name == "model.embed_tokens.weight" else Role.HEAD
    if ".shared_mlp." in name:
        return Role.FFN
    if ".self_attn." in name:
        return Role.ATTN_PROJ
    if ".mamba.in_proj." in name:
        return Role.STATE_PROJ  # z, x, B, C and dt
    if ".mamba.out_proj." in name:
        return Role.OUT_PROJ
    if ".mamba." in name and not name.endswith("norm.weight"):
        return Role.SSM  # conv1d, A_log, dt_bias, D
    return Role.NORM


KEEP_FLOAT_ROLES = frozenset({Role.STATE_PROJ, Role.SSM, Role.NORM, Role.EMBEDDING})
