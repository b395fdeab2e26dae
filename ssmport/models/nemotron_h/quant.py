"""Which Nemotron-H weights stay float under int8keepproj (benchmarks/hybrid_quant_predicate.py)."""

from __future__ import annotations

from ssmport.quant.roles import Role


def role(name: str) -> Role:
    """Plan category of a canonical weight name (fused names like `{...q_proj...,...v_proj...}` too)."""
    if name in ("embeddings.weight", "lm_head.weight"):
        return Role.EMBEDDING if name == "embeddings.weight" else Role.HEAD
    leaf = name.rsplit(".mixer.", 1)[-1]
    if leaf.startswith("gate."):  # an MoE router and its correction bias: they decide the experts
        return Role.ROUTER
    if leaf.startswith(("up_proj.", "down_proj.", "experts.", "shared_experts.", "{experts.")):
        return Role.FFN
    if leaf.startswith(("q_proj.", "k_proj.", "v_proj.", "o_proj.")):
        return Role.ATTN_PROJ
    if leaf.startswith("in_proj."):
        return Role.STATE_PROJ  # z, x, B, C and dt
    if leaf.startswith("out_proj."):
        return Role.OUT_PROJ
    if leaf.startswith("conv1d.") or leaf in ("A_log", "dt_bias", "D"):
        return Role.SSM
    return Role.NORM


KEEP_FLOAT_ROLES = frozenset({Role.STATE_PROJ, Role.SSM, Role.NORM, Role.EMBEDDING, Role.ROUTER})
