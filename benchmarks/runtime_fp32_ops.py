"""This runtime's fp32 arithmetic between the matmuls, against torch's, bit for bit.

Each op is converted alone (coreai-torch), run on the Linux Core AI runtime over the same
random inputs, and compared with torch: how many outputs differ and by how many units in the
last place. Then softplus's relative error against float64 by input range (coreai-torch lowers
`log1p(u)` to `log(1 + u)` in the program, so the device computes it so too), and which order
the runtime sums a reduction in. With --effect PRESET..., how far that softplus moves each
preset's fp32 module (torch, the gate's stream) next to its own rounding (its distance from
the fp64 module).

    python benchmarks/runtime_fp32_ops.py
    python benchmarks/runtime_fp32_ops.py --effect mamba2-130m mamba-130m
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from coreai_micro import loaded_main
from fp16_gate_floor import gate_streams, logit_scale
from torch.overrides import TorchFunctionMode

ROWS = 64  # reductions: 64 rows of 64
ELEMENTWISE = {
    "exp": torch.exp, "log": lambda x: torch.log(x.abs() + 1e-3), "sqrt": lambda x: torch.sqrt(x.abs()),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 1e-3), "sigmoid": torch.sigmoid, "silu": F.silu, "tanh": torch.tanh,
    "softplus": F.softplus, "relu^2": lambda x: torch.relu(x) ** 2, "mul": lambda x: x * 1.7, "div": lambda x: x / 1.3,
    "sum of 64": lambda x: x.view(ROWS, -1).sum(-1), "mean of 64": lambda x: x.view(ROWS, -1).mean(-1),
    "rms norm of 64": lambda x: (x.view(ROWS, -1) * torch.rsqrt(x.view(ROWS, -1).pow(2).mean(-1, keepdim=True) + 1e-5)),
}  # fmt: skip


class _Op(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def on_runtime(fn, x: np.ndarray) -> np.ndarray:
    from coreai.runtime import NDArray

    with loaded_main(_Op(fn), x, []) as (loop, main):
        return loop.run_until_complete(main(inputs={"x": NDArray(x)}, state={}))["y"].numpy().reshape(-1)


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def elementwise_table(x: np.ndarray) -> None:
    for name, fn in ELEMENTWISE.items():
        got, want = on_runtime(fn, x), fn(torch.from_numpy(x)).numpy().reshape(-1)
        print(f"{name:15s} differs from torch at {int((got != want).sum()):4d} of {want.size}, "
              f"by {int(ulps(got, want).max())} ulp at most", flush=True)  # fmt: skip


def softplus_ranges() -> None:
    x = np.linspace(-20, 20, 4001).astype(np.float32)
    got, want = on_runtime(F.softplus, x), F.softplus(torch.from_numpy(x)).numpy()
    exact = np.log1p(np.exp(x.astype(np.float64)))
    for lo, hi in [(-20, -15), (-15, -10), (-10, -5), (-5, -2), (-2, 0), (0, 20)]:
        m = (x >= lo) & (x < hi)
        print(f"softplus on [{lo}, {hi}): relative error vs float64 {np.max(np.abs(got[m] - exact[m]) / exact[m]):.2e} "
              f"here, {np.max(np.abs(want[m] - exact[m]) / exact[m]):.2e} in torch", flush=True)  # fmt: skip


def reduction_order(x: np.ndarray) -> None:
    rows = x.reshape(ROWS, -1)
    got = on_runtime(lambda v: v.view(ROWS, -1).sum(-1), x)
    sequential = np.zeros(ROWS, np.float32)
    for i in range(rows.shape[1]):
        sequential = (sequential + rows[:, i]).astype(np.float32)
    pairwise = rows.copy()
    while pairwise.shape[1] > 1:
        pairwise = (pairwise[:, 0::2] + pairwise[:, 1::2]).astype(np.float32)
    torch_sum = torch.from_numpy(rows).sum(-1).numpy()
    print(f"a sum of 64 equals, of {ROWS} rows: input by input in fp32 {int((got == sequential).sum())}, pairwise "
          f"{int((got == pairwise[:, 0]).sum())}, torch's {int((got == torch_sum).sum())}", flush=True)  # fmt: skip


class ConverterSoftplus(TorchFunctionMode):
    """softplus (and log1p) as the converted program computes them: log(1 + u) in fp32 (the
    default beta and threshold, the only ones the models use). Each instance is a context, so
    the class itself serves as a `Form`'s `math`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.softplus:
            x = args[0]
            return torch.where(x > 20, x, torch.log(1 + torch.exp(x)))  # torch's default threshold
        if func is torch.log1p:
            return torch.log(1 + args[0])
        return func(*args, **(kwargs or {}))


def softplus_effect(preset: str) -> None:
    from ssmport.gate.reference import FP64, Form, reference_logits
    from ssmport.gate.report import streams_max_abs_delta
    from ssmport.loader.resolve import DEFAULT_SEED, load_model

    model = load_model(preset, synthetic=True, seed=DEFAULT_SEED)
    streams = gate_streams(model, prompts=1, steps=8)
    exact = reference_logits(model, streams, form=FP64)
    scale = logit_scale(exact)
    fp32 = streams_max_abs_delta(reference_logits(model, streams), exact) / scale
    naive = streams_max_abs_delta(reference_logits(model, streams, form=Form(math=ConverterSoftplus)), exact) / scale
    print(f"{preset}: the fp32 module {fp32:.3e} of scale from fp64; with the converter's softplus {naive:.3e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--effect", nargs="*", default=None, metavar="PRESET", help="torch only: the softplus's effect")
    args = ap.parse_args()
    if args.effect:
        for preset in args.effect:
            softplus_effect(preset)
        return
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3).numpy()
    elementwise_table(x)
    softplus_ranges()
    reduction_order(x)


if __name__ == "__main__":
    main()
