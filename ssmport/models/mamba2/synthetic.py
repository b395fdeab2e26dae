"""Deterministic random Mamba-2 weights (see `GeneratedSource`). Scales follow mamba_ssm's
init: A = 1..16, dt = softplus^-1 of log-uniform [1e-3, 1e-1], D = 1."""

from __future__ import annotations

import math

import torch

from ssmport.models.inits import a_log_init, dt_bias_init


def mixer_init(leaf: str, shape: tuple[int, ...], rand: torch.Tensor, randn: torch.Tensor) -> torch.Tensor | None:
    """A Mamba-2 mixer tensor's value by its leaf name (uniform and normal draws of its shape
    given), or None for a projection or the gated norm's gain (the caller's defaults)."""
    if leaf == "A_log":
        return a_log_init(rand)
    if leaf == "dt_bias":
        return dt_bias_init(rand)
    if leaf == "D":
        return 1.0 + 0.1 * randn
    if leaf == "conv1d.weight":
        return randn / math.sqrt(shape[-1])
    if leaf.endswith(".bias"):
        return 0.1 * randn
    return None


def weight_init(embedding: str, head: str, marker: str):
    """The init of a model built of Mamba-2-style layers (Mamba-2; the hybrids reuse it): the
    embedding N(0, 1), mixer tensors by their leaf name after `marker` (`mixer_init`), biases
    small, gains near 1, the head 2/sqrt(fan-in), every other matrix 1/sqrt(fan-in)."""

    def init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
        rand = torch.rand(shape, generator=g)
        randn = torch.randn(shape, generator=g)
        leaf = name.split(marker, 1)[1] if marker in name else name
        if name == embedding:
            return randn
        value = mixer_init(leaf, shape, rand, randn)
        if value is not None:
            return value
        if len(shape) == 1:  # norm gains
            return 1.0 + 0.1 * randn
        if name == head:
            return randn * (2.0 / math.sqrt(shape[1]))
        return randn / math.sqrt(shape[1])  # projections; a squeezed conv [C, K] by 1/sqrt(K)

    return init


synthetic_init = weight_init("embeddings.weight", "lm_head.weight", ".mixer.")
