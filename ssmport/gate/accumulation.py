"""A 16-bit recipe's module with its matmuls' sums made explicit: fp32 sums, or this runtime's.

The Linux Core AI runtime computes a 16-bit matmul by rounding each product to fp16 and adding
the products one input after another into an fp16 sum: bit-exact on every form this project
ships (one row and many, column-blocked, transposed, int8 blocks dequantized to fp16, int4
blocks with zero points, gathered expert stacks; measured, tests/test_gate_accumulation.py). A
GPU or ANE backend typically keeps fp16 operands but sums in fp32. Two forms of the recipe's
torch module (the SAME stored weights the bundle holds: fp16 values, integer blocks times their
fp16 scales) separate the two:

- `accumulate_in_fp32`: every 16-bit matmul layer takes fp16-rounded inputs and sums in fp32.
  Its distance from the fp32 reference is what the recipe costs.
- `runtime_fp16_sums()`: inside it every fp16 x fp16 matmul sums as this runtime does. The
  recipe's module run inside it is the bundle's own computation in torch, so a correct bundle
  lands on it (to the fp32 rounding of everything between the matmuls), and the fp16 recipe's
  is what the fp32 reference itself moves when run in 16-bit here: the 16-bit gates' noise floor.

(docs/quantization.md, "The 16-bit gates' noise floor")
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ssmport.ops.matmul import BlockwiseMatmul, FloatMatmul

OPERAND_DTYPE = torch.float16  # the matmul inputs of the 16-bit recipes


def fp16_running_sums(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., M, in] @ w [..., in, N] (batch dims broadcast; either may be 1-D, as in
    torch.matmul) as this runtime sums an fp16 matmul: each product rounded to fp16 and added
    to the running fp16 sum, input by input (fp16 result)."""
    x, w = x.to(OPERAND_DTYPE), w.to(OPERAND_DTYPE)
    vector_x, vector_w = x.dim() == 1, w.dim() == 1
    x = x.unsqueeze(0) if vector_x else x
    w = w.unsqueeze(-1) if vector_w else w
    batch = torch.broadcast_shapes(x.shape[:-2], w.shape[:-2])
    acc = torch.zeros(*batch, x.shape[-2], w.shape[-1], dtype=OPERAND_DTYPE)
    product = torch.empty_like(acc)
    for i in range(x.shape[-1]):
        torch.mul(x[..., :, i : i + 1], w[..., i : i + 1, :], out=product)  # rounded to fp16, not fused into the add
        acc.add_(product)
    if vector_w:
        acc = acc.squeeze(-1)
    if vector_x:  # its row axis is now the last one when w was a vector too
        acc = acc.squeeze(-1 if vector_w else -2)
    return acc


_MATMULS = frozenset({torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.mm})


class _RuntimeSums(TorchFunctionMode):
    """Every fp16 x fp16 matmul computed by `fp16_running_sums`; everything else as it is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _MATMULS and not kwargs and len(args) == 2 and all(
            isinstance(a, torch.Tensor) and a.dtype == OPERAND_DTYPE for a in args
        ):
            return fp16_running_sums(*args)
        return func(*args, **(kwargs or {}))


@contextmanager
def runtime_fp16_sums() -> Iterator[None]:
    """Run a module with every fp16 matmul summed as this runtime sums it."""
    with _RuntimeSums():
        yield


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
        if layer.compute_dtype != OPERAND_DTYPE:
            return None  # dequantized, then an fp32 matmul: no 16-bit sums to separate
        return layer.dequant()  # integer blocks * fp16 scales, as the asset dequantizes them
    if isinstance(layer, FloatMatmul) and layer.weight.dtype == OPERAND_DTYPE:
        w = layer.weight
        return w.permute(1, 0, 2).reshape(w.shape[1], layer.n_out) if layer.blocks > 1 else w
    return None


def accumulate_in_fp32(module: nn.Module) -> nn.Module:
    """Swap every 16-bit matmul layer of `module` for its fp32-accumulating twin, in place."""
    twins: dict[int, Fp32Accumulating] = {}  # a layer read in two places (a tied head) gets one twin
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            twin = twins.get(id(child))
            if twin is None and (w := stored_weight(child)) is not None:
                twin = twins[id(child)] = Fp32Accumulating(w.detach(), child.out_dtype, child)
            if twin is not None:
                setattr(parent, name, twin)
    return module
