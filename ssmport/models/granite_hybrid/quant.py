"""Which Granite-4.0-H weights stay float under int8keepproj (benchmarks/hybrid_quant_predicate.py):
the Mamba-2 in_proj and per-channel vectors (ssmport.models.hybrid.MAMBA_KEEP_FLOAT_ROLES), and
the MoE router (it decides the experts; the experts are FFN, the bulk).

The routed experts (Granite-4.0-H-Tiny / -Small's) are int4keepproj's 4-bit bulk
(INT4_SAFE_EXPERTS), not held at its int8 floor: on the trained
tests/data/granitemoehybrid_moe_pydoc (241 held-out bytes; benchmarks/trained_moe.py, the bundles
on the Core AI runtime) 4-bit experts passed the gate at 0.0125 of the logit scale (0.0067 with
int8 experts), kept every one of the 167 top-1s with a margin > 0.5 (top-1 239 of 241 either
way) for an asset 0.705x int8keepproj's instead of 0.926x; held-out max |Δ| 0.095 against
0.098. The `down` (output_linear) stack is the fragile one (alone at 4 bits, torch with fp32
sums: 0.100, against 0.023 for gate|up; benchmarks/int4_experts.py)."""

from __future__ import annotations

from ssmport.models.hybrid import MAMBA_KEEP_FLOAT_ROLES, mamba_attention_role
from ssmport.quant.roles import Role

_dense_role = mamba_attention_role(".shared_mlp.")


def role(name: str) -> Role:
    if name.endswith(".block_sparse_moe.router.layer.weight"):
        return Role.ROUTER
    return Role.FFN if ".block_sparse_moe." in name else _dense_role(name)


KEEP_FLOAT_ROLES = MAMBA_KEEP_FLOAT_ROLES | {Role.ROUTER}
INT4_SAFE_EXPERTS = True
