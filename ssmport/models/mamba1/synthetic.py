"""Deterministic random Mamba-1 weights (see `GeneratedSource`): Mamba-2's draws by leaf name
(A = 1..16, D near 1, convs by 1/sqrt(K)); dt_proj's bias is mamba_ssm's dt init,
softplus^-1 of log-uniform [1e-3, 1e-1]."""

from __future__ import annotations

import torch

from ssmport.models.inits import dt_bias_init
from ssmport.models.mamba2.synthetic import weight_init

_mamba2_style = weight_init("embeddings.weight", "lm_head.weight", ".mixer.")


def synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    if name.endswith(".mixer.dt_proj.bias"):
        return dt_bias_init(torch.rand(shape, generator=g))
    return _mamba2_style(name, shape, g)
