"""Can the Linux Core AI runtime multiply by a chosen expert's weights without copying them first?
(issues 28/32). One decode step (M=1) of a routed-expert layer at LFM2-8B-A1B's released widths
(32 experts, top-4, C=2048, F=1792: gate|up [E, 2048, 3584], down [E, 1792, 2048], fp32), with
each way of reading the chosen experts' weights:

    gather  W[idx] (aten.index -> gather_nd), then one batched matmul: ssmport's export form
            before this benchmark (it copies the k experts' weights, then the matmul reads the copy)
    slice   per chosen expert j: e = idx[j].item(), W.narrow(0, e, 1): a slice whose start is a
            runtime value, then its own matmul (k slices + k matmuls per stack)
    dense   every expert (x @ the whole stack), weighted by a one-hot routing row: no gather, but
            reads all E experts
    branch  per expert e of the E: torch.cond(e is chosen, out + w_e * expert_e(x), out), the
            branch reading W[e] with a static e (a static slice of the stack, which the runtime
            does not copy): E `if` ops, k of them taken

Per form: median ms per call (unprofiled), the runtime's profile of one call by op type (ms and
count, `NDArray.*` bookkeeping events included: a slice that is a view shows as
`NDArray.alloc_view` and no copy), kernels per call, and max |out - naive per-expert loop|.

    flock /tmp/ssmport-heavy.lock env PYTHONPATH=$PWD python benchmarks/moe_inplace.py \\
        [--forms gather slice dense branch] [--calls 10] [--json benchmarks/results/moe_inplace_....json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from coreai_micro import loaded_model, timed_calls  # noqa: E402
from profile_ops import recorder  # noqa: E402

from ssmport.runtime.op_count import CALL_EVENT, summarize  # noqa: E402


class Step(torch.nn.Module):
    """Router (sigmoid, top-k, normalized) + k SwiGLU experts read in `form`; x [1, C] -> [1, C]."""

    def __init__(self, form: str, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, k: int):
        super().__init__()
        self.form, self.k = form, k
        self.router = torch.nn.Parameter(router, requires_grad=False)  # [C, E]
        self.gate_up = torch.nn.Parameter(gate_up, requires_grad=False)  # [E, C, 2F]
        self.down = torch.nn.Parameter(down, requires_grad=False)  # [E, F, C]

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.sigmoid(x @ self.router)
        w, idx = torch.topk(scores, self.k, dim=-1)
        return idx.reshape(-1), (w / w.sum(-1, keepdim=True)).reshape(-1)

    @staticmethod
    def swiglu(a: torch.Tensor) -> torch.Tensor:
        g, u = a.chunk(2, dim=-1)
        return F.silu(g) * u

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx, w = self.route(x)
        E, C = self.gate_up.shape[0], x.shape[-1]
        if self.form == "gather":
            a = self.swiglu(x.view(1, 1, C) @ self.gate_up[idx])  # [k, 1, F]
            y = (a @ self.down[idx]).view(self.k, C)
            return (y * w.view(self.k, 1)).sum(0, keepdim=True)
        if self.form == "slice":
            out = None
            for j in range(self.k):
                e = idx[j].item()
                torch._check(e >= 0)
                torch._check(e < E)
                a = self.swiglu(x @ self.gate_up.narrow(0, e, 1)[0])  # [1, F]
                y = (a @ self.down.narrow(0, e, 1)[0]) * w[j]
                out = y if out is None else out + y
            return out
        if self.form == "branch":
            experts = torch.arange(E, dtype=idx.dtype)
            picked = idx.view(-1, 1) == experts  # [k, E]
            dense = (picked.to(w.dtype) * w.view(-1, 1)).sum(0)  # [E]
            chosen = picked.any(0)
            out = torch.zeros_like(x)
            for e in range(E):
                out = torch.cond(chosen[e], self._add_expert, self._keep, (out, x, dense[e], self.gate_up[e], self.down[e]))
            return out
        if self.form == "dense":
            experts = torch.arange(E, dtype=idx.dtype)
            dense = ((idx.view(-1, 1) == experts).to(w.dtype) * w.view(-1, 1)).sum(0)  # [E]
            a = self.swiglu(x.view(1, 1, C) @ self.gate_up)  # [E, 1, F]
            y = (a @ self.down).view(E, C)
            return (y * dense.view(E, 1)).sum(0, keepdim=True)
        raise ValueError(self.form)


    @staticmethod
    def _add_expert(out, x, w, gate_up, down):
        return out + w * (Step.swiglu(x @ gate_up) @ down)

    @staticmethod
    def _keep(out, x, w, gate_up, down):
        return out.clone()  # a branch may not return its input itself


def naive(step: Step, x: torch.Tensor) -> torch.Tensor:
    """The readable per-expert loop in float64: out = sum_j w_j down_e(silu(gate_e x) * up_e x)."""
    idx, w = step.route(x)
    out = torch.zeros(x.shape[-1], dtype=torch.float64)
    for j, e in enumerate(idx.tolist()):
        a = Step.swiglu(x[0].double() @ step.gate_up[e].double())
        out += float(w[j]) * (a @ step.down[e].double())
    return out.view(1, -1)


def measure(step: Step, x: np.ndarray, calls: int) -> dict:
    from coreai.runtime import NDArray

    inputs = {"x": NDArray(x)}
    with loaded_model(step, x, []) as (loop, model):
        fn = model.load_function("main")
        times = timed_calls(loop, fn, inputs, {}, calls)
        y = loop.run_until_complete(fn(inputs=inputs, state={}))["y"].numpy()
        del fn
        profiler, intervals = recorder()
        fn = model.load_function("main", profiler=profiler)
        loop.run_until_complete(fn(inputs=inputs, state={}))
        intervals.clear()
        loop.run_until_complete(fn(inputs=inputs, state={}))
        del fn
    ops = [(n, ns) for n, ns in intervals if n != CALL_EVENT]
    by_type: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for name, ns in ops:
        by_type[name][0] += 1
        by_type[name][1] += ns / 1e6
    ref = naive(step, torch.from_numpy(x)).numpy()
    return {
        "ms_per_call": float(np.median(times)),
        "ms_calls": [round(t, 2) for t in times],
        "kernels_per_call": summarize([n for n, _ in ops]).ops,
        "profile": {k: {"count": c, "ms": round(ms, 3)} for k, (c, ms) in sorted(by_type.items(), key=lambda kv: -kv[1][1])},
        "max_abs_vs_naive_fp64": float(np.abs(y - ref).max()),
        "out_scale": float(np.abs(ref).max()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--forms", nargs="+", default=["gather", "slice", "dense", "branch"])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--width", type=int, default=1792)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    C, Fe, E = a.hidden, a.width, a.experts
    g = torch.Generator().manual_seed(0)
    router = torch.randn(C, E, generator=g) * C**-0.5  # unscaled logits saturate the sigmoid: ties
    gate_up = torch.randn(E, C, 2 * Fe, generator=g) * C**-0.5
    down = torch.randn(E, Fe, C, generator=g) * Fe**-0.5
    x = np.random.default_rng(0).standard_normal((1, C)).astype(np.float32)
    expert_mb = 3 * C * Fe * 4 / 1e6
    print(f"C={C} F={Fe} {a.top_k} of {E} experts, fp32: {expert_mb:.1f} MB an expert, {a.top_k * expert_mb:.0f} MB chosen a token")
    results = {"shape": {"hidden": C, "width": Fe, "experts": E, "top_k": a.top_k}, "forms": {}}
    for form in a.forms:
        r = measure(Step(form, router, gate_up, down, a.top_k).eval(), x, a.calls)
        results["forms"][form] = r
        top = ", ".join(f"{k} {v['count']}x {v['ms']:.1f} ms" for k, v in list(r["profile"].items())[:6])
        print(f"{form:>7}: {r['ms_per_call']:8.2f} ms/call  {r['kernels_per_call']:3d} kernels  "
              f"max|d| vs fp64 loop {r['max_abs_vs_naive_fp64']:.2e} (scale {r['out_scale']:.2f})\n         {top}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
