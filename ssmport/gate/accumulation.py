"""A 16-bit recipe's own error, apart from this runtime's: the recipe's module with fp32 sums.

The Linux Core AI runtime sums fp16 matmuls in fp16; a GPU or ANE backend typically keeps fp16
operands but sums in fp32. `accumulate_in_fp32` turns the recipe's torch module (the SAME
stored weights the bundle holds: fp16 values, integer blocks times their fp16 scales) into one
whose every 16-bit matmul takes fp16-rounded inputs and sums in fp32. Its distance from the fp32
reference is what the recipe costs; the bundle's, beyond it, is this runtime's accumulation
(docs/quantization.md, "Which part of the error is the recipe, and which is this runtime").
"""

from __future__ import annotations

import torch
from torch import nn

from ssmport.ops.matmul import BlockwiseMatmul, FloatMatmul

OPERAND_DTYPE = torch.float16  # the matmul inputs of the 16-bit recipes


class Fp32Accumulating(nn.Module):
    """x @ W with W the values a 16-bit matmul layer stores, inputs rounded to fp16, sums fp32."""

    def __init__(self, weight_in_out: torch.Tensor, out_dtype: torch.dtype, layer: nn.Module | None = None):
        super().__init__()
        self.weight = weight_in_out.float()
        self.out_dtype = out_dtype
        # A tied table reads its rows from the layer's storage (ssmport.quant.tied): no sums, so
        # from the layer as it is (a bound method: the layer is not a submodule of the twin).
        self._columns = getattr(layer, "columns", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.to(OPERAND_DTYPE).float() @ self.weight).to(self.out_dtype)

    def columns(self, ids: torch.Tensor) -> torch.Tensor:
        return self._columns(ids)


def stored_weight(layer: nn.Module) -> torch.Tensor | None:
    """The logical [in, out] weight a 16-bit matmul layer holds (None: an fp32 layer)."""
    if isinstance(layer, BlockwiseMatmul):
        return layer.dequant()  # integer blocks * fp16 scales, as the asset dequantizes them
    if isinstance(layer, FloatMatmul) and layer.weight.dtype == OPERAND_DTYPE:
        w = layer.weight
        return w.permute(1, 0, 2).reshape(w.shape[1], layer.n_out) if layer.blocks > 1 else w
    return None


def accumulate_in_fp32(module: nn.Module) -> nn.Module:
    """Swap every 16-bit matmul of `module` for its fp32-accumulating twin, in place."""
    twins: dict[int, Fp32Accumulating] = {}  # a layer read in two places (a tied head) gets one twin
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            twin = twins.get(id(child))
            if twin is None and (w := stored_weight(child)) is not None:
                twin = twins[id(child)] = Fp32Accumulating(w.detach(), child.out_dtype, child)
            if twin is not None:
                setattr(parent, name, twin)
    return module
