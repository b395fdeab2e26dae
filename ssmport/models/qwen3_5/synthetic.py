"""Deterministic random Qwen3.5 weights with trained-like scales (transformers' init where it
matters: A = 1..16, dt = softplus^-1 of log-uniform [1e-3, 1e-1])."""

from __future__ import annotations

import math

import torch

from ssmport.models.inits import decay_init
from ssmport.models.qwen3_5.checkpoints import NORM
from ssmport.models.qwen3_5.mtp_checkpoint import MTP_NORM, MTP_NORM_EMBEDDING, MTP_NORM_HIDDEN

# Qwen3.5's zero-centred norms multiply by (1 + w): w near 0 is a gain near 1.
_ZERO_CENTRED = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight", "k_norm.weight")
_ZERO_CENTRED_NAMES = (NORM, MTP_NORM, MTP_NORM_EMBEDDING, MTP_NORM_HIDDEN)  # the final norm, the MTP head's norms


def synthetic_init(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    randn = torch.randn(shape, generator=g)
    decay = decay_init(name, shape, g)
    if decay is not None:
        return decay
    if name.endswith("conv1d.weight"):
        return 0.5 * randn
    if name.endswith(_ZERO_CENTRED) or name in _ZERO_CENTRED_NAMES:
        return 0.1 * randn
    if len(shape) == 1:  # the GDN output norm's plain gain, biases
        return (1.0 if name.endswith("norm.weight") else 0.0) + 0.1 * randn
    if name in ("model.embed_tokens.weight", "lm_head.weight"):  # logits of std ~2, tied or not
        return randn * (2.0 / math.sqrt(shape[1]))
    return randn / math.sqrt(shape[1])  # projections [out, in]
