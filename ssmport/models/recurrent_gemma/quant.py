"""Which RecurrentGemma weights stay float under int8keepproj: what feeds the RG-LRU (linear_x,
fused with linear_y; the conv; the gates and Λ) and the norms; the MLP, the attention, the
recurrent block's output projection and the head are quantized."""

from __future__ import annotations

from ssmport.quant.roles import Role


def role(name: str) -> Role:
    """Plan category of a canonical weight name (fused names like `{...linear_x,...linear_y}.weight` too)."""
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return Role.EMBEDDING if name == "model.embed_tokens.weight" else Role.HEAD
    if ".mlp_block." in name:
        return Role.FFN
    if "_proj." in name:
        return Role.ATTN_PROJ  # q/k/v/o of the local attention
    if ".linear_x" in name:
        return Role.STATE_PROJ  # x enters the conv and the recurrence (linear_y rides in the same matmul)
    if ".linear_out." in name:
        return Role.OUT_PROJ
    if "conv_1d." in name:
        return Role.CONV
    if "recurrent_param" in name:
        return Role.DECAY
    if "rg_lru." in name:
        return Role.MIX  # the input and recurrence gates
    return Role.NORM


KEEP_FLOAT_ROLES = frozenset({Role.STATE_PROJ, Role.CONV, Role.DECAY, Role.MIX, Role.NORM, Role.EMBEDDING})
