"""The fp32 export-form module computed in float64: how far the fp32 reference itself is
from exact math on its own weights (the gate's noise floor, docs/parity.md).

The export form is written for fp32 in every family (`.float()`, `.to(torch.float32)`, fp32
`out_dtype`s, fp32 state buffers), so instead of threading a dtype through every block and
op, the fp32 module is built as usual, its float weights and states are cast to float64 (the
same values: fp32 -> fp64 is exact, and derived weights such as -exp(A_log) were rounded to
fp32 at build, as the bundle stores them), and it runs inside `float64_math()`: a torch
function mode that turns every request for float32 into float64 and makes float64 the
default dtype. Build outside the mode: a synthetic source drawn in fp64 would be other weights.
tests/test_gate_noise_floor.py checks, on every built-in tiny preset, that a step under the
mode makes no float32 tensor at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.overrides import TorchFunctionMode


class _Float64Math(TorchFunctionMode):
    """float32 asked for anywhere (a dtype argument, `Tensor.float`) becomes float64."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        args = tuple(_promoted(a) for a in args)
        kwargs = {k: _promoted(v) for k, v in (kwargs or {}).items()}
        return func(*args, **kwargs)


def _promoted(value):
    if value is torch.float32:
        return torch.float64
    if isinstance(value, (list, tuple)):
        return type(value)(_promoted(v) for v in value)
    return value


@contextmanager
def float64_math() -> Iterator[None]:
    """Run an fp32 export-form module (cast by `to_float64`) in float64 throughout."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with _Float64Math():
            yield
    finally:
        torch.set_default_dtype(before)


def to_float64(module: nn.Module) -> nn.Module:
    """`module`'s float weights and state buffers cast to float64 in place, one tensor at a
    time (each fp32 tensor is freed once converted unless something else holds it), and so
    are float32 tensors blocks keep as plain attributes (constants such as a rotate-half
    matrix, which `Module.double` does not see)."""
    module.double()
    for sub in module.modules():
        for name, value in vars(sub).items():
            if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
                setattr(sub, name, value.double())
    return module
