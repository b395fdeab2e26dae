"""Deterministic random Mamba-2 weights (see `GeneratedSource`). Scales follow mamba_ssm's
init: A = 1..16, dt = softplus^-1 of log-uniform [1e-3, 1e-1], D = 1."""

from __future__ import annotations

import math

import torch


def synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    rand = torch.rand(shape, generator=g)
    randn = torch.randn(shape, generator=g)
    leaf = name.split(".mixer.", 1)[1] if ".mixer." in name else name
    if name == "embeddings.weight":
        return randn
    if leaf == "A_log":
        return torch.log(1 + 15 * rand)
    if leaf == "dt_bias":
        dt = torch.exp(rand * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        return dt + torch.log(-torch.expm1(-dt))  # inverse softplus
    if leaf == "D":
        return 1.0 + 0.1 * randn
    if leaf == "conv1d.weight":
        return randn / math.sqrt(shape[-1])
    if leaf.endswith(".bias"):
        return 0.1 * randn
    if len(shape) == 1:  # norm gains
        return 1.0 + 0.1 * randn
    if name == "lm_head.weight":
        return randn * (2.0 / math.sqrt(shape[1]))
    return randn / math.sqrt(shape[1])  # in_proj / out_proj
