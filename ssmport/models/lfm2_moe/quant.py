"""LFM2-MoE roles: LFM2's, with the router and expert bias (which decide the experts) and the
conv `out_proj` kept float.

The conv out_proj is int8 in dense LFM2 (decided on a synthetic lfm2-350m). On the tiny
LFM2-MoE fixture of tests/moe_files.py (the first hybrid fixture whose width, 64, lets it
quantize) int8 there alone moved the logits by 0.159 of their scale, against 0.012 for every
routed expert in int8 and 0.011 for the attention projections (torch, 16 steps); kept float it
costs 18 x 2048^2 fp16 of LFM2-8B-A1B's 8.3B parameters (1%, 5% of the active ones)."""

from ssmport.models.lfm2.quant import KEEP_FLOAT_ROLES as LFM2_KEEP_FLOAT
from ssmport.models.lfm2.quant import role as lfm2_role
from ssmport.quant.roles import Role


def role(name: str) -> Role:
    if name.endswith((".feed_forward.gate.weight", ".feed_forward.expert_bias")):
        return Role.ROUTER
    return lfm2_role(name)  # the experts are ".feed_forward.": FFN, the bulk


KEEP_FLOAT_ROLES = LFM2_KEEP_FLOAT | {Role.ROUTER, Role.OUT_PROJ}
