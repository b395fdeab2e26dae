"""Which RWKV-7 weights stay float under int8keepproj."""

from __future__ import annotations

import re

from ssmport.quant.roles import Role


def role(name: str) -> Role:
    """Plan category of a canonical weight name."""
    if name in ("emb.weight", "head.weight"):
        return Role.EMBEDDING if name == "emb.weight" else Role.HEAD
    if name.startswith("ln_out."):
        return Role.NORM
    _, _, block, leaf, *_ = name.split(".") + [""]
    if block == "ffn" and leaf in ("key", "value"):
        return Role.FFN
    if block == "att" and leaf in ("receptance", "key", "value", "output"):
        return Role.STATE_PROJ
    if block == "att" and re.fullmatch("[wavg][12]", leaf):
        return Role.LORA
    if block.startswith("ln") or leaf == "ln_x":
        return Role.NORM
    return Role.MIX  # x_*, k_k, k_a, r_k, w0/a0/v0


# The r/k/v/o projections and every LoRA factor feed the recurrence: int8 there flips
# borderline tokens, while int8 on the FFN and LM head (the weight bulk) costs nothing
# measurable (the gate of the port this project grew from: 127/127 vs 126/127).
KEEP_FLOAT_ROLES = frozenset({Role.STATE_PROJ, Role.LORA, Role.NORM, Role.MIX, Role.EMBEDDING})

# Next to a 4-bit FFN, int8 on r/k/v/o and the LoRAs adds nothing measurable on the trained
# rwkv7-pydoc (teacher-forced, torch, fp32 sums: max |Δ| 0.0613 of scale with them int8 vs
# 0.0616 with them fp16; benchmarks/int4_choices.py), and halves the bytes they cost.
INT8_SAFE_ROLES = frozenset({Role.STATE_PROJ, Role.LORA})
