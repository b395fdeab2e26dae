"""Deterministic random RWKV-7 weights (see `GeneratedSource`). Scales follow RWKV-LM's init
ranges closely enough for lively, non-degenerate logits."""

from __future__ import annotations

import math

import torch


def synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    randn = torch.randn(shape, generator=g)
    leaf = name.rsplit(".", 1)[-1]
    fan_in = shape[-1] if name.endswith(".weight") and len(shape) == 2 else shape[0]
    if name == "emb.weight":
        return randn
    if name.endswith(".weight") and len(shape) == 1:  # norm gains
        return 1.0 + 0.1 * randn
    if name.endswith(".bias"):
        return 0.1 * randn
    if leaf.startswith("x_"):
        return torch.rand(shape, generator=g)
    special = {"w0": lambda: torch.linspace(-6.0, -0.5, shape[0]) + 0.3 * randn, "a0": lambda: 0.5 * randn,
               "v0": lambda: 0.5 * randn, "k_k": lambda: 0.7 + 0.1 * randn, "k_a": lambda: 1.0 + 0.05 * randn,
               "r_k": lambda: -0.04 + 0.2 * randn}  # fmt: skip
    if leaf in special:
        return special[leaf]()
    if leaf[:1] in "wavg" and leaf[1:] in ("1", "2"):
        return randn * (0.5 / math.sqrt(shape[0]))
    if name == "head.weight":
        return randn * (2.0 / math.sqrt(fan_in))
    return randn / math.sqrt(fan_in)  # r/k/v/o and FFN projections
