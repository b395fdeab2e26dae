"""Which OLMo-Hybrid weights stay float under int8keepproj: Qwen3.5's split (its
measurements: ssmport/models/qwen3_5/quant.py), for the same reason. Everything the delta rule
reads (q/k/v through the conv, a, b, the output gate g), the conv, the decays and the
delta-rule out_proj stay float: an error there is folded into the recurrent state at every
token, and with allow_neg_eigval a beta near 2 reflects rather than damps it. The attention
projections, the MLP and the head go int8 (attention K/V enter the cache once and are never
fed back)."""

from __future__ import annotations

from ssmport.models.hybrid import common_role
from ssmport.models.olmo_hybrid.checkpoints import EMBED, HEAD
from ssmport.quant.roles import Role


def role(name: str) -> Role:
    """Plan category of a canonical weight name (fused names such as `self_attn.{q,k,v}` too)."""
    common = common_role(name, EMBED, HEAD)
    if common is not None:
        return common
    if ".linear_attn." in name:
        if name.endswith("o_proj.weight"):
            return Role.OUT_PROJ
        if name.endswith(("A_log", "dt_bias")):
            return Role.DECAY
        if "conv1d" in name:
            return Role.CONV
        if "_proj" in name:
            return Role.STATE_PROJ  # q, k, v (into the conv), a, b, g: everything the delta rule reads
    return Role.NORM


KEEP_FLOAT_ROLES = frozenset({Role.STATE_PROJ, Role.OUT_PROJ, Role.CONV, Role.DECAY, Role.NORM, Role.EMBEDDING})
