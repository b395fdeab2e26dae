"""Which Mamba-2 weights stay float under int8keepproj (docs/quantization.md, "Mamba-2")."""

from __future__ import annotations

from ssmport.quant.roles import Role


def role(name: str) -> Role:
    """Plan category of a canonical weight name."""
    if name in ("embeddings.weight", "lm_head.weight"):
        return Role.EMBEDDING if name == "embeddings.weight" else Role.HEAD
    leaf = name.split(".mixer.", 1)[1] if ".mixer." in name else name
    if leaf.startswith("in_proj."):
        return Role.STATE_PROJ  # produces x, B, C, dt (and the gate z)
    if leaf.startswith("out_proj."):
        return Role.OUT_PROJ
    if leaf.startswith("conv1d.") or leaf in ("dt_bias", "A_log", "D"):
        return Role.SSM
    return Role.NORM


# Measured (benchmarks/mamba2_quant.py; tiny model, 4 streams x 48 teacher-forced steps vs fp32):
# - in_proj produces x, B, C and dt, all of which enter the recurrence; dt goes through
#   exp(dt * A), so its error compounds in the state: always fp16.
# - out_proj writes the residual stream that every later layer's recurrence reads: with it int8
#   the error was several times that of head-only int8, for ~1/3 of the layer weights.
# - the LM head reads nothing back into the state: int8 there costs the least per byte saved.
KEEP_FLOAT_ROLES = frozenset({Role.STATE_PROJ, Role.OUT_PROJ, Role.SSM, Role.NORM, Role.EMBEDDING})
