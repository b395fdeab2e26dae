"""Which Qwen3.5 weights stay float under int8keepproj (benchmarks/qwen35_quant_predicate.py)."""

from __future__ import annotations

from ssmport.models.hybrid import common_role
from ssmport.models.qwen3_5.checkpoints import EMBED, HEAD
from ssmport.quant.roles import Role


def role(name: str) -> Role:
    """Plan category of a canonical weight name (fused names such as `self_attn.{q,k,v}` too)."""
    common = common_role(name, EMBED, HEAD)
    if common is not None:
        return common
    if ".linear_attn." in name:
        if "in_proj" in name:
            return Role.STATE_PROJ  # q | k | v (into the conv), a, b, z: everything the delta rule reads
        if "out_proj" in name:
            return Role.OUT_PROJ
        if "conv1d" in name:
            return Role.CONV
        if name.endswith(("A_log", "dt_bias")):
            return Role.DECAY
    return Role.NORM


# Float: what the delta rule and the conv read (in_proj_*, conv1d, A_log, dt_bias), the
# delta-rule layers' out_proj, the norms and the embedding. int8: the SwiGLU MLP, the LM head
# and the attention projections. Teacher-forced torch logits, max |Δ| / logit scale, at the
# 0.8B widths with 8 layers (benchmarks/results/qwen35_quant_predicate_0.8b-widths*.json):
# MLP + head int8 3.96e-2; attention q/k/v/o int8 on top 4.09e-2 (top-1 unchanged, 58/64); the
# delta-rule out_proj on top 4.61e-2 (56/64); the delta-rule in_proj on top 7.50e-2. Attention
# K/V enter the cache once and are never folded back into it, unlike the delta rule's inputs.
KEEP_FLOAT_ROLES = frozenset({Role.STATE_PROJ, Role.OUT_PROJ, Role.CONV, Role.DECAY, Role.NORM, Role.EMBEDDING})
