"""Blockwise integer weights: one fp16 scale (and, affine, one zero point) per block of
BLOCK_SIZE inputs of an [in, out] weight, at 8 or 4 bits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ssmport.quant.recipes import BLOCK_SIZE


@dataclass(frozen=True)
class Blockwise:
    """W ≈ scale * (q - zero_point) per block. `q` holds one value per int8/uint8 element
    (the converter packs 4-bit values two to a byte); `zero_point` is None when symmetric."""

    q: torch.Tensor  # [in, out]: int8 (symmetric) or uint8 (affine)
    scale: torch.Tensor  # fp16 [in/32, out]
    zero_point: torch.Tensor | None  # same dtype as q, [in/32, out]
    bits: int

    @property
    def storage_dtype(self) -> str:
        """The element type the asset stores ("int8", "int4", "uint4")."""
        return f"{'u' if self.zero_point is not None else ''}int{self.bits}"

    @property
    def nbytes(self) -> int:
        """Data, scales and zero points as the asset stores them (4-bit packed two to a byte)."""
        per_block = self.scale.numel() * (2 + (self.bits / 8 if self.zero_point is not None else 0))
        return int(self.q.numel() * self.bits // 8 + per_block)


def quantize_blockwise(weight_in_out: torch.Tensor, bits: int = 8, affine: bool = False) -> Blockwise:
    """Quantize along the input dimension in blocks of 32.

    Symmetric: q = round(w / s) in [-(2^(b-1) - 1), 2^(b-1) - 1], s = max|w| / that bound.
    Affine: q = round(w / s) + z in [0, 2^b - 1], s = (max - min) / (2^b - 1), z = round(-min / s),
    so each block's own range (not its largest magnitude) spans the levels. Scales are rounded
    to fp16 *before* q is computed, so dequantizing with the stored scale is exactly what the
    quantizer assumed.
    """
    n_in, n_out = weight_in_out.shape
    if n_in % BLOCK_SIZE:
        raise ValueError(f"input dim {n_in} is not a multiple of {BLOCK_SIZE}")
    w = weight_in_out.float().reshape(n_in // BLOCK_SIZE, BLOCK_SIZE, n_out)
    tiny = torch.finfo(torch.float16).tiny  # keeps an all-zero block from dividing by zero
    if affine:
        levels = 2**bits - 1
        lo = w.amin(dim=1, keepdim=True).clamp(max=0.0)  # the range includes 0: z is a level
        hi = w.amax(dim=1, keepdim=True).clamp(min=0.0)
        scale = ((hi - lo) / levels).clamp(min=tiny).to(torch.float16)
        zero = torch.round(-lo / scale.float()).clamp(0, levels)
        q = (torch.round(w / scale.float()) + zero).clamp(0, levels).to(torch.uint8)
        zero_point = zero.to(torch.uint8).reshape(n_in // BLOCK_SIZE, n_out)
    else:
        bound = 2 ** (bits - 1) - 1
        scale = (w.abs().amax(dim=1, keepdim=True) / bound).clamp(min=tiny).to(torch.float16)
        q = torch.round(w / scale.float()).clamp(-bound, bound).to(torch.int8)
        zero_point = None
    return Blockwise(q.reshape(n_in, n_out), scale.reshape(n_in // BLOCK_SIZE, n_out), zero_point, bits)


def dequantize_blockwise(b: Blockwise) -> torch.Tensor:
    """The float weight a block store represents (fp32)."""
    n_in, n_out = b.q.shape
    q = b.q.float().reshape(n_in // BLOCK_SIZE, BLOCK_SIZE, n_out)
    if b.zero_point is not None:
        q = q - b.zero_point.float()[:, None, :]
    return (q * b.scale.float()[:, None, :]).reshape(n_in, n_out)
