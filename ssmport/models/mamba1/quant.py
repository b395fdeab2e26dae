"""Which Mamba-1 weights stay float under int8keepproj (docs/quantization.md, "Mamba-1")."""

from __future__ import annotations

from ssmport.quant.roles import Role


def role(name: str) -> Role:
    """Plan category of a canonical weight name."""
    if name in ("embeddings.weight", "lm_head.weight"):
        return Role.EMBEDDING if name == "embeddings.weight" else Role.HEAD
    leaf = name.split(".mixer.", 1)[1] if ".mixer." in name else name
    if leaf.startswith(("in_proj.", "x_proj.")):
        return Role.STATE_PROJ  # x (and the gate z); dt, B, C
    if leaf.startswith("out_proj."):
        return Role.OUT_PROJ
    if leaf.startswith(("conv1d.", "dt_proj.")) or leaf in ("A_log", "D"):
        return Role.SSM
    return Role.NORM


# The policy measured on Mamba-2 (ssmport.models.mamba2.quant), whose recurrence this one shares:
# - x_proj makes dt, B and C and dt_proj expands dt: dt goes through exp(dt * A), so its error
#   compounds in the state; B and C multiply every state entry. in_proj makes x, which the
#   conv and the scan read. All stay float (fp16 matmuls; conv, dt bias, A_log, D fp32 vectors).
# - out_proj writes the residual stream every later layer's scan reads: float.
# - the LM head reads nothing back into the state: int8 there costs the least per byte saved.
KEEP_FLOAT_ROLES = frozenset({Role.STATE_PROJ, Role.OUT_PROJ, Role.SSM, Role.NORM, Role.EMBEDDING})
