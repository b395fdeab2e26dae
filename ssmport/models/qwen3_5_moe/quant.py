"""Qwen3.5-MoE roles: Qwen3.5's (the experts and shared expert are `.mlp.`: FFN, int8 under
int8keepproj), with the router and the shared-expert gate float (they decide, and are [C, E])."""

from ssmport.models.qwen3_5.quant import KEEP_FLOAT_ROLES as DENSE_KEEP_FLOAT
from ssmport.models.qwen3_5.quant import role as dense_role
from ssmport.quant.roles import Role


def role(name: str) -> Role:
    if name.endswith((".mlp.gate.weight", ".mlp.shared_expert_gate.weight")):
        return Role.ROUTER
    return dense_role(name)


KEEP_FLOAT_ROLES = DENSE_KEEP_FLOAT | {Role.ROUTER}
