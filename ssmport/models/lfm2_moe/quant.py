"""LFM2-MoE roles: LFM2's, with the router and expert bias (which decide the experts) and the
conv `out_proj` kept float.

The conv out_proj is int8 in dense LFM2 (decided on a synthetic lfm2-350m). On the tiny
LFM2-MoE fixture of tests/moe_files.py (the first hybrid fixture whose width, 64, lets it
quantize) int8 there alone moved the logits by 0.159 of their scale, against 0.012 for every
routed expert in int8 and 0.011 for the attention projections (torch, 16 steps); kept float it
costs 18 x 2048^2 fp16 of LFM2-8B-A1B's 8.3B parameters (1%, 5% of the active ones).

The routed experts are int4keepproj's 4-bit bulk (INT4_SAFE_EXPERTS), not held at its int8
floor: on the trained tests/data/lfm2_moe_pydoc (241 held-out bytes, torch with fp32 sums;
benchmarks/int4_experts.py) 4-bit experts next to the rest of int4keepproj measured max |Δ|
0.113 of the logit scale against 0.093 with int8 experts, top-1 229 vs 230 of 241, no flip of
the 167 top-1s with a margin > 0.5 either way, for a plan of 0.67x int8keepproj's instead of
0.92x; the random lfm2-moe-tiny measured 0.395 vs 0.398 (docs/quantization.md)."""

from ssmport.models.lfm2.quant import KEEP_FLOAT_ROLES as LFM2_KEEP_FLOAT
from ssmport.models.lfm2.quant import role as lfm2_role
from ssmport.quant.roles import Role


def role(name: str) -> Role:
    if name.endswith((".feed_forward.gate.weight", ".feed_forward.expert_bias")):
        return Role.ROUTER
    return lfm2_role(name)  # the experts are ".feed_forward.": FFN, the bulk


KEEP_FLOAT_ROLES = LFM2_KEEP_FLOAT | {Role.ROUTER, Role.OUT_PROJ}
INT4_SAFE_EXPERTS = True
