"""Which LFM3 weights stay float under int8keepproj: LFM2's roles, which name LFM3's tensors
alike (the attention gate `self_attn.gate_proj` is an attention projection; the sandwich norms
are norms). LFM2's measurement (benchmarks/hybrid_quant_predicate.py) stands in; none was run
on LFM3's own weights."""

from __future__ import annotations

from ssmport.models.lfm2.quant import KEEP_FLOAT_ROLES, role

__all__ = ["KEEP_FLOAT_ROLES", "role"]
