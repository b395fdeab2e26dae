"""Deterministic random Gated DeltaNet weights (fla's init ranges where they matter)."""

from __future__ import annotations

import math

import torch

from ssmport.models.inits import decay_init


def synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    randn = torch.randn(shape, generator=g)
    decay = decay_init(name, shape, g)
    if decay is not None:
        return decay
    if "_conv1d." in name:
        return 0.5 * randn if name.endswith(".weight") else 0.1 * randn
    if len(shape) == 1:  # norm gains
        return 1.0 + 0.1 * randn
    if name == "model.embeddings.weight":
        return randn
    if name == "lm_head.weight":
        return randn * (2.0 / math.sqrt(shape[1]))
    return randn / math.sqrt(shape[1])  # projections [out, in]
