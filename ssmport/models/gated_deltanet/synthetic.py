"""Deterministic random Gated DeltaNet weights (fla's init ranges where they matter)."""

from __future__ import annotations

import math

import torch


def synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    randn = torch.randn(shape, generator=g)
    if name.endswith("A_log"):  # A ~ U(1, 16), fla's range
        return torch.log(1 + 15 * torch.rand(shape, generator=g))
    if name.endswith("dt_bias"):  # softplus^-1 of dt ~ logU(1e-3, 1e-1), fla's init
        dt = torch.exp(torch.rand(shape, generator=g) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        return dt + torch.log(-torch.expm1(-dt))
    if "_conv1d." in name:
        return 0.5 * randn if name.endswith(".weight") else 0.1 * randn
    if len(shape) == 1:  # norm gains
        return 1.0 + 0.1 * randn
    if name == "model.embeddings.weight":
        return randn
    if name == "lm_head.weight":
        return randn * (2.0 / math.sqrt(shape[1]))
    return randn / math.sqrt(shape[1])  # projections [out, in]
