"""Which Nemotron-H weights stay float under int8keepproj (benchmarks/hybrid_quant_predicate.py).

The routed experts of the MoE layers (Nemotron-3 Nano's `E`) are int4keepproj's 4-bit bulk
(INT4_SAFE_EXPERTS), not held at its int8 floor: on the trained tests/data/nemotron_h_moe_pydoc
(241 held-out bytes; benchmarks/trained_moe.py, the bundles on the Core AI runtime) 4-bit experts
passed the gate at 0.014 of the logit scale (0.008 with int8 experts), kept every one of the 177
top-1s with a margin > 0.5 (top-1 239 of 241 either way) for an asset 0.755x int8keepproj's
instead of 0.948x; held-out max |Δ| 0.102 against 0.063. The `down` stack is the fragile one
(alone at 4 bits, torch with fp32 sums: 0.103, against 0.041 for `up`; benchmarks/int4_experts.py)."""

from __future__ import annotations

from ssmport.quant.roles import Role


def role(name: str) -> Role:
    """Plan category of a canonical weight name (fused names like `{...q_proj...,...v_proj...}` too)."""
    if name in ("embeddings.weight", "lm_head.weight"):
        return Role.EMBEDDING if name == "embeddings.weight" else Role.HEAD
    leaf = name.rsplit(".mixer.", 1)[-1]
    if leaf.startswith("gate."):  # an MoE router and its correction bias: they decide the experts
        return Role.ROUTER
    if leaf.startswith(("up_proj.", "down_proj.", "experts.", "shared_experts.", "{experts.")):
        return Role.FFN
    if leaf.startswith(("q_proj.", "k_proj.", "v_proj.", "o_proj.")):
        return Role.ATTN_PROJ
    if leaf.startswith("in_proj."):
        return Role.STATE_PROJ  # z, x, B, C and dt
    if leaf.startswith("out_proj."):
        return Role.OUT_PROJ
    if leaf.startswith("conv1d.") or leaf in ("A_log", "dt_bias", "D"):
        return Role.SSM
    return Role.NORM


KEEP_FLOAT_ROLES = frozenset({Role.STATE_PROJ, Role.SSM, Role.NORM, Role.EMBEDDING, Role.ROUTER})
INT4_SAFE_EXPERTS = True
