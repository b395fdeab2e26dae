"""A 16-bit recipe's module with its matmuls' sums made explicit: fp32 sums, or this runtime's.

The Linux Core AI runtime computes a 16-bit matmul by rounding each product to fp16 and adding
the products one input after another into an fp16 sum: bit-exact on every form this project
ships (one row and many, column-blocked, transposed, int8 blocks dequantized to fp16; measured,
tests/test_gate_accumulation.py). A GPU or ANE backend typically keeps fp16 operands but sums
in fp32. Two twins of the recipe's torch module (the SAME stored weights the bundle holds:
fp16 values, integer blocks times their fp16 scales) separate the two:

- `accumulate_in_fp32`: every 16-bit matmul takes fp16-rounded inputs and sums in fp32. Its
  distance from the fp32 reference is what the recipe costs.
- `accumulate_as_this_runtime`: every 16-bit matmul sums as this runtime does. It is the
  bundle's own computation in torch, so a correct bundle lands on it (to the fp32 rounding of
  everything between the matmuls), and the fp16 recipe's twin is what the fp32 reference
  itself moves when run in 16-bit here: the 16-bit gates' noise floor.

(docs/quantization.md, "Which part of the error is the recipe, and which is this runtime")
"""

from __future__ import annotations

import torch
from torch import nn

from ssmport.ops.matmul import BlockwiseMatmul, FloatMatmul

OPERAND_DTYPE = torch.float16  # the matmul inputs of the 16-bit recipes


def fp16_running_sums(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., in] @ w [in, out] (fp16 values) as this runtime sums: each product rounded to
    fp16 and added to the running fp16 sum, input by input (fp16 result)."""
    rows = x.to(OPERAND_DTYPE).reshape(-1, x.shape[-1])
    w = w.to(OPERAND_DTYPE)
    acc = torch.zeros(rows.shape[0], w.shape[1], dtype=OPERAND_DTYPE)
    product = torch.empty_like(acc)
    for i in range(w.shape[0]):
        torch.mul(rows[:, i : i + 1], w[i], out=product)  # rounded to fp16, not fused into the add
        acc.add_(product)
    return acc.reshape(*x.shape[:-1], w.shape[1])


class SummedMatmul(nn.Module):
    """x @ W with W the values a 16-bit matmul layer stores, on fp16-rounded inputs, summed in
    fp32 (`runtime_sums` False) or as this runtime sums (True)."""

    def __init__(self, weight_in_out: torch.Tensor, out_dtype: torch.dtype, layer: nn.Module | None = None,
                 runtime_sums: bool = False):  # fmt: skip
        super().__init__()
        self.runtime_sums = runtime_sums
        # fp32 sums read the weight as fp32; runtime sums as the fp16 values the asset holds.
        self.weight = weight_in_out.to(OPERAND_DTYPE if runtime_sums else torch.float32)
        self.out_dtype = out_dtype
        # A tied table reads its rows from the layer's storage (ssmport.quant.tied): no sums, so
        # from the layer as it is (a bound method: the layer is not a submodule of the twin).
        self._columns = getattr(layer, "columns", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.runtime_sums:
            return fp16_running_sums(x, self.weight).to(self.out_dtype)
        return (x.to(OPERAND_DTYPE).float() @ self.weight).to(self.out_dtype)

    def columns(self, ids: torch.Tensor) -> torch.Tensor:
        return self._columns(ids)


def stored_weight(layer: nn.Module) -> torch.Tensor | None:
    """The logical [in, out] weight a 16-bit matmul layer holds (None: an fp32 layer)."""
    if isinstance(layer, BlockwiseMatmul):
        if layer.compute_dtype != OPERAND_DTYPE:
            return None  # dequantized, then an fp32 matmul: no 16-bit sums to separate
        return layer.dequant()  # integer blocks * fp16 scales, as the asset dequantizes them
    if isinstance(layer, FloatMatmul) and layer.weight.dtype == OPERAND_DTYPE:
        w = layer.weight
        return w.permute(1, 0, 2).reshape(w.shape[1], layer.n_out) if layer.blocks > 1 else w
    return None


def _swap_16bit_matmuls(module: nn.Module, runtime_sums: bool) -> nn.Module:
    twins: dict[int, SummedMatmul] = {}  # a layer read in two places (a tied head) gets one twin
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            twin = twins.get(id(child))
            if twin is None and (w := stored_weight(child)) is not None:
                twin = twins[id(child)] = SummedMatmul(w.detach(), child.out_dtype, child, runtime_sums)
            if twin is not None:
                setattr(parent, name, twin)
    return module


def accumulate_in_fp32(module: nn.Module) -> nn.Module:
    """Swap every 16-bit matmul of `module` for its fp32-summing twin, in place."""
    return _swap_16bit_matmuls(module, runtime_sums=False)


def accumulate_as_this_runtime(module: nn.Module) -> nn.Module:
    """Swap every 16-bit matmul of `module` for a twin that sums as this runtime does, in place."""
    return _swap_16bit_matmuls(module, runtime_sums=True)
