"""Deterministic random RecurrentGemma weights (see `GeneratedSource`): the Mamba-2-style
scales (unit embeddings, gains near 1, projections by 1/sqrt(fan-in), the conv by 1/sqrt(K)),
and Λ spread so softplus(Λ) runs from 0.02 to 2.1: slow and fast channels side by side."""

from __future__ import annotations

import torch

from ssmport.models.mamba2.synthetic import weight_init
from ssmport.models.recurrent_gemma.checkpoints import EMBEDDING, HEAD

_scaled = weight_init(EMBEDDING, HEAD, ".temporal_block.")


def synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    if name.endswith("rg_lru.recurrent_param"):
        return torch.empty(shape).uniform_(-4.0, 2.0, generator=g)
    return _scaled(name, shape, g)
