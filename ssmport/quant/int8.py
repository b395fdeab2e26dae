"""Symmetric blockwise int8: one fp16 scale per block of BLOCK_SIZE inputs of an [in, out] weight."""

from __future__ import annotations

import torch

from ssmport.quant.blockwise import Blockwise, dequantize_blockwise, quantize_blockwise


def quantize_int8_blockwise(weight_in_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one fp16 scale per block of 32 along the input dimension.

    Returns (q int8 [in, out], scale fp16 [in/32, out]) with W ≈ q * scale (per block).
    """
    b = quantize_blockwise(weight_in_out, bits=8)
    return b.q, b.scale


def dequantize_int8_blockwise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float weight an int8 block store represents (fp32)."""
    return dequantize_blockwise(Blockwise(q, scale, None, 8))
