"""Deterministic random RWKV-6 weights (see `GeneratedSource`), in RWKV-LM x060's init ranges
closely enough for lively, non-degenerate logits."""

from __future__ import annotations

import math

import torch

from ssmport.models.rwkv7.synthetic import synthetic_init as rwkv7_init


def synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """x060's own tensors here; embedding, norms, projections and head as RWKV-7's."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("time_maa_w1", "time_maa_w2", "time_decay_w1", "time_decay_w2"):
        return torch.randn(shape, generator=g) * (0.5 / math.sqrt(shape[-2]))
    if leaf.startswith("time_maa_"):
        return torch.rand(shape, generator=g)
    if leaf == "time_decay":  # log(-log w) from -6 (slow) to 1 (w = e^-2.7 per token)
        return torch.linspace(-6.0, 1.0, shape[0]) + 0.3 * torch.randn(shape, generator=g)
    if leaf == "time_faaaa":
        return 0.5 * torch.randn(shape, generator=g)
    return rwkv7_init(name, shape, g)
