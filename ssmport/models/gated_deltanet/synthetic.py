"""Deterministic random Gated DeltaNet weights (fla's init ranges where they matter)."""

from __future__ import annotations

import math

import torch

from ssmport.models.inits import a_log_init, dt_bias_init


def synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    randn = torch.randn(shape, generator=g)
    if name.endswith("A_log"):
        return a_log_init(torch.rand(shape, generator=g))
    if name.endswith("dt_bias"):
        return dt_bias_init(torch.rand(shape, generator=g))
    if "_conv1d." in name:
        return 0.5 * randn if name.endswith(".weight") else 0.1 * randn
    if len(shape) == 1:  # norm gains
        return 1.0 + 0.1 * randn
    if name == "model.embeddings.weight":
        return randn
    if name == "lm_head.weight":
        return randn * (2.0 / math.sqrt(shape[1]))
    return randn / math.sqrt(shape[1])  # projections [out, in]
