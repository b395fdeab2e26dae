"""Which Falcon-H1 weights stay float under int8keepproj: as Granite-4.0-H and Nemotron-H
decide (benchmarks/hybrid_quant_predicate.py), the Mamba-2 in_proj (z, x, B, C, dt: what
enters the recurrence, its rounding carried in the state for the whole conversation) and the
per-channel conv / A_log / dt_bias / D vectors; int8: the attention projections, the MLP, the
Mamba out_proj and the head. The folded µP multipliers (block.py) scale whole rows, which a
per-row int8 scale absorbs."""

from __future__ import annotations

from ssmport.models.hybrid import MAMBA_KEEP_FLOAT_ROLES, mamba_attention_role

role = mamba_attention_role(".feed_forward.")
KEEP_FLOAT_ROLES = MAMBA_KEEP_FLOAT_ROLES
