"""Symmetric blockwise int8: one fp16 scale per block of BLOCK_SIZE inputs of an [in, out] weight."""

from __future__ import annotations

import torch

from ssmport.quant.recipes import BLOCK_SIZE


def quantize_int8_blockwise(weight_in_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one fp16 scale per block of 32 along the input dimension.

    Returns (q int8 [in, out], scale fp16 [in/32, out]) with W ≈ q * scale (per block).
    Scales are rounded to fp16 *before* q is computed, so dequantizing with the stored
    scale is exactly what the quantizer assumed.
    """
    n_in, n_out = weight_in_out.shape
    if n_in % BLOCK_SIZE:
        raise ValueError(f"input dim {n_in} is not a multiple of {BLOCK_SIZE}")
    w = weight_in_out.float().reshape(n_in // BLOCK_SIZE, BLOCK_SIZE, n_out)
    amax = w.abs().amax(dim=1, keepdim=True)
    # The smallest normal fp16 keeps an all-zero block from dividing by zero.
    scale = (amax / 127.0).clamp(min=torch.finfo(torch.float16).tiny).to(torch.float16)
    q = torch.round(w / scale.float()).clamp(-127, 127).to(torch.int8)
    return q.reshape(n_in, n_out), scale.reshape(n_in // BLOCK_SIZE, n_out)


def dequantize_int8_blockwise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float weight an int8 block store represents (fp32)."""
    n_in, n_out = q.shape
    blocks = q.float().reshape(n_in // BLOCK_SIZE, BLOCK_SIZE, n_out) * scale.float()[:, None, :]
    return blocks.reshape(n_in, n_out)
