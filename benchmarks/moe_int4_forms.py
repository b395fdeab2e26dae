"""One decode step of a 4-bit routed-expert layer at LFM2-8B-A1B's width (4 of 32 experts,
C=2048, F=1792) on the Linux Core AI runtime: ms per call and the runtime's per-op-type times
(its `Profiler`, minimum over the profiled calls per op), for each stack form given.

    PYTHONPATH=$PWD python benchmarks/moe_int4_forms.py [--calls 4] [FORM ...]

Forms: `fp32` (FloatExperts), `int8` (Int8Experts), `int4` (Int4Experts), each as
`ssmport.quant.plan.WeightBuilder.experts` builds it and `ExpertMixture._gathered` applies it;
`int4-before`, the 4-bit form before 2026-12-05 (fp16 unpacking, a concat); `int4-fp32compute`,
the 4-bit form with fp32 weights and matmul (other sums: comparison only).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from coreai_micro import loaded_main  # noqa: E402
from profile_ops import by_op_type, per_call, recorder  # noqa: E402

from ssmport.ops.matmul import FloatExperts, Int4Experts, Int8Experts, pack_nibbles  # noqa: E402
from ssmport.quant.blockwise import quantize_blockwise  # noqa: E402

E, C, FE, K = 32, 2048, 1792, 4


class Int4Before(Int4Experts):
    """The form before (2026-12-05): the nibbles split in fp16 ops and concatenated into
    [n, in, out], then scaled in fp16 (the same fp16 weights)."""

    def times(self, x, idx):
        p, scale = self.q[idx].to(torch.float16), self.scale[idx]  # scale [n, 2, blocks, out/2]
        high = torch.floor(p * (1 / 16))
        w = torch.cat([p - 16 * high, high], dim=-1) - 8
        n, n_in, n_out = w.shape
        blocks = scale.shape[2]
        scale = scale.transpose(1, 2).reshape(n, blocks, 1, n_out)
        w = (w.view(n, blocks, n_in // blocks, n_out) * scale).view(n, n_in, n_out)
        return x @ w.view(x.shape[0], -1, n_in, n_out)


class Int4Fp32Compute(Int4Experts):
    """Another graph (comparison only): today's form with the weights kept fp32 and the matmul
    in fp32 (fp32 sums, what `Recipe.compute_dtype = float32` does to dense integer matmuls)."""

    dtype = torch.float32


VARIANTS = {"int4": Int4Experts, "int4-before": Int4Before, "int4-fp32compute": Int4Fp32Compute}


def stack(form: str, w: torch.Tensor):
    if form == "fp32":
        return FloatExperts(w)
    blocks = [quantize_blockwise(e, bits=8 if form == "int8" else 4) for e in w]
    q, scale = torch.stack([b.q for b in blocks]), torch.stack([b.scale for b in blocks])
    return Int8Experts(q, scale) if form == "int8" else VARIANTS[form](pack_nibbles(q), scale)


class Step(torch.nn.Module):
    """Route x [1, C] to K of E experts and apply their SwiGLU, as `ExpertMixture` does."""

    def __init__(self, form: str):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.router = torch.nn.Parameter(torch.randn(C, E, generator=g), requires_grad=False)
        self.gate_up = stack(form, torch.randn(E, C, 2 * FE, generator=g) * C**-0.5)
        self.down = stack(form, torch.randn(E, FE, C, generator=g) * FE**-0.5)

    def forward(self, x):
        weights, idx = torch.topk(torch.sigmoid(x @ self.router), K, dim=-1)
        idx, dt = idx.reshape(K), self.gate_up.dtype
        a = self.gate_up.times(x.to(dt).view(1, 1, 1, C), idx).float()
        g, u = a.split([FE, FE], dim=-1)
        y = self.down.times((F.silu(g) * u).to(dt), idx)
        return (y.float().view(K, C) * weights.view(K, 1)).sum(0, keepdim=True)


def measure(form: str, calls: int) -> dict:
    from coreai.runtime import NDArray

    x = np.random.default_rng(0).standard_normal((1, C)).astype(np.float32)
    profiler, intervals = recorder()
    with loaded_main(Step(form), x, [], profiler=profiler) as (loop, fn):
        inputs = {"x": NDArray(x)}
        for _ in range(2):
            loop.run_until_complete(fn(inputs=inputs, state={}))
        intervals.clear()
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            loop.run_until_complete(fn(inputs=inputs, state={}))
            times.append(1000 * (time.perf_counter() - start))
    calls_ops = per_call(intervals)
    return {"form": form, "ms_per_call": float(np.median(times)), "ops": min(len(c) for c in calls_ops),
            "by_type": by_op_type(calls_ops)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("forms", nargs="*", default=["fp32", "int8", "int4"])
    p.add_argument("--calls", type=int, default=4)
    p.add_argument("--json", help="write the results here too")
    a = p.parse_args()
    results = []
    for form in a.forms:
        r = measure(form, a.calls)
        results.append(r)
        print(f"{form:>6}: {r['ms_per_call']:9.1f} ms/call (profiled), {r['ops']} ops")
        for name, t in r["by_type"].items():
            print(f"          {name:32} {t['ms']:9.2f} ms {100 * t['share']:5.1f}% {t['ops']:4d} ops")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
