"""Which Gated DeltaNet weights stay float under int8keepproj (benchmarks/gdn_quant_predicate.py)."""

from __future__ import annotations

from ssmport.quant.roles import Role


def role(name: str) -> Role:
    """Plan category of a canonical weight name (fused names like `attn.{q,k,v}_proj` too)."""
    if name in ("model.embeddings.weight", "lm_head.weight"):
        return Role.EMBEDDING if name == "model.embeddings.weight" else Role.HEAD
    if ".mlp." in name:
        return Role.FFN
    if ".attn.o_proj." in name:
        return Role.OUT_PROJ
    if ".attn." in name and "_proj" in name:
        return Role.STATE_PROJ  # q/k/v/a/b/g: everything the recurrence reads
    if "_conv1d." in name:
        return Role.CONV
    if name.endswith(("A_log", "dt_bias")):
        return Role.DECAY
    return Role.NORM


# What the recurrence reads (q/k/v/a/b/g projections, convs, A_log, dt_bias), the norms, and
# o_proj (int8 there: 6.8e-2 vs 2.5e-2 of scale) stay float; the SwiGLU MLP and the LM head
# (the weight bulk) are int8.
KEEP_FLOAT_ROLES = frozenset({Role.STATE_PROJ, Role.OUT_PROJ, Role.CONV, Role.DECAY, Role.NORM, Role.EMBEDDING})
