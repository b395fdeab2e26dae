"""Which Granite-4.0-H weights stay float under int8keepproj (benchmarks/hybrid_quant_predicate.py):
the Mamba-2 in_proj and per-channel vectors (ssmport.models.hybrid.MAMBA_KEEP_FLOAT_ROLES), and
the MoE router (it decides the experts; the experts are FFN, the bulk)."""

from __future__ import annotations

from ssmport.models.hybrid import MAMBA_KEEP_FLOAT_ROLES, mamba_attention_role
from ssmport.quant.roles import Role

_dense_role = mamba_attention_role(".shared_mlp.")


def role(name: str) -> Role:
    if name.endswith(".block_sparse_moe.router.layer.weight"):
        return Role.ROUTER
    return Role.FFN if ".block_sparse_moe." in name else _dense_role(name)


KEEP_FLOAT_ROLES = MAMBA_KEEP_FLOAT_ROLES | {Role.ROUTER}
