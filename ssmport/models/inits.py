"""Synthetic-weight draws that several packages' synthetic.py share: the decay and step-size
inits of Mamba-2-style and gated-delta-rule layers (mamba_ssm's and fla's ranges), each from
a uniform draw the caller made, so every package keeps its own order of draws."""

from __future__ import annotations

import math

import torch


def a_log_init(rand: torch.Tensor) -> torch.Tensor:
    """log A with A ~ U(1, 16), from U(0, 1) draws."""
    return torch.log(1 + 15 * rand)


def dt_bias_init(rand: torch.Tensor) -> torch.Tensor:
    """softplus^-1 of dt ~ logU(1e-3, 1e-1), from U(0, 1) draws: softplus(dt_bias) = dt."""
    dt = torch.exp(rand * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
    return dt + torch.log(-torch.expm1(-dt))


def decay_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor | None:
    """A gated-delta-rule layer's `*A_log` or `*dt_bias` (one uniform draw), else None."""
    if name.endswith("A_log"):
        return a_log_init(torch.rand(shape, generator=g))
    if name.endswith("dt_bias"):
        return dt_bias_init(torch.rand(shape, generator=g))
    return None
