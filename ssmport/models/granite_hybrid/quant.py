"""Which Granite-4.0-H weights stay float under int8keepproj (benchmarks/hybrid_quant_predicate.py):
the Mamba-2 in_proj and per-channel vectors (ssmport.models.hybrid.MAMBA_KEEP_FLOAT_ROLES)."""

from __future__ import annotations

from ssmport.models.hybrid import MAMBA_KEEP_FLOAT_ROLES, mamba_attention_role

role = mamba_attention_role(".shared_mlp.")
KEEP_FLOAT_ROLES = MAMBA_KEEP_FLOAT_ROLES
