"""Qwen3.5-MoE roles: Qwen3.5's (the experts and shared expert are `.mlp.`: FFN, int8 under
int8keepproj), with the router and the shared-expert gate float (they decide, and are [C, E]).

The routed experts are int4keepproj's 4-bit bulk (INT4_SAFE_EXPERTS), not held at its int8
floor: on the trained tests/data/qwen3_5_moe_pydoc (241 held-out bytes; benchmarks/trained_moe.py,
the bundles on the Core AI runtime) 4-bit experts passed the gate at 0.099 of the logit scale
(0.089 with int8 experts), kept every one of the 174 top-1s with a margin > 0.5 (top-1 233 vs
234 of 241) for an asset 0.683x int8keepproj's instead of 0.915x; held-out max |Δ| 0.130 against
0.133. The gate|up stack is the fragile one (alone at 4 bits, torch with fp32 sums: 0.131,
against 0.057 for down; benchmarks/int4_experts.py). The random qwen3.5-moe-tiny flips confident
top-1s with 4-bit experts (docs/quantization.md): its routing is random, this one's trained."""

from ssmport.models.qwen3_5.quant import KEEP_FLOAT_ROLES as DENSE_KEEP_FLOAT
from ssmport.models.qwen3_5.quant import role as dense_role
from ssmport.quant.roles import Role


def role(name: str) -> Role:
    if name.endswith((".mlp.gate.weight", ".mlp.shared_expert_gate.weight")):
        return Role.ROUTER
    return dense_role(name)


KEEP_FLOAT_ROLES = DENSE_KEEP_FLOAT | {Role.ROUTER}
INT4_SAFE_EXPERTS = True
