"""Deterministic random OLMo-Hybrid weights with trained-like scales (transformers' init where
it matters: A = 1..16, dt = softplus^-1 of log-uniform [1e-3, 1e-1]); plain RMSNorm gains near 1."""

from __future__ import annotations

import math

import torch

from ssmport.models.inits import decay_init


def synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    randn = torch.randn(shape, generator=g)
    decay = decay_init(name, shape, g)
    if decay is not None:
        return decay
    if name.endswith("conv1d.weight"):
        return 0.5 * randn
    if len(shape) == 1:  # every norm gain (all plain: x / rms(x) * w)
        return 1.0 + 0.1 * randn
    if name in ("model.embed_tokens.weight", "lm_head.weight"):  # logits of std ~2, tied or not
        return randn * (2.0 / math.sqrt(shape[1]))
    return randn / math.sqrt(shape[1])  # projections [out, in]
