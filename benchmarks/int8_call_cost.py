"""Where an integer matmul's time goes on the Linux Core AI runtime: per-op times of one
[in, out] matmul in the shipped int8 form and its alternatives, at 1 row (decode) and at a
prefill chunk's rows.

    python benchmarks/int8_call_cost.py --shape 768 3072 --rows 1 64 --json benchmarks/results/int8_call_cost.json

Forms: `fp32` and `fp16` (FloatMatmul), `int8` (BlockwiseMatmul as every integer recipe ships
it: constexpr dequantization to fp16, fp16 matmul), `int8-fp32-compute` (the same blocks,
`compute_dtype=float32`: a different graph, measured for comparison only). Times are the
runtime Profiler's, per op type, averaged over --calls calls after one untimed call.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import numpy as np
import torch

from ssmport.ops.matmul import BlockwiseMatmul, FloatMatmul
from ssmport.quant.int8 import quantize_int8_blockwise
from ssmport.runtime.op_count import CALL_EVENT, op_type

from coreai_micro import loaded_main  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def profiled_call(module: torch.nn.Module, x: np.ndarray, calls: int) -> dict:
    """ms per call and ms per op type of `module` (forward(x) -> y) on the Core AI runtime."""
    from coreai.runtime import NDArray, Profiler

    starts: dict[int, tuple[str, int]] = {}
    spans: list[tuple[str, int]] = []

    def begin(event) -> int:
        starts[len(starts)] = (event.event_id, event.timestamp)
        return len(starts) - 1

    def end(event, token: int) -> None:
        name, t0 = starts.pop(token)
        spans.append((name, event.timestamp - t0))

    with loaded_main(module, x, [], Profiler(on_log_event_begin=begin, on_log_event_end=end)) as (loop, fn):
        inputs = {"x": NDArray(x)}
        loop.run_until_complete(fn(inputs=inputs, state={}))
        spans.clear()
        start = time.perf_counter()
        for _ in range(calls):
            loop.run_until_complete(fn(inputs=inputs, state={}))
        ms = 1000 * (time.perf_counter() - start) / calls
    ops: collections.Counter = collections.Counter()
    for name, ns in spans:
        if name != CALL_EVENT:
            ops[op_type(name)] += ns / 1e6 / calls
    return {"ms": round(ms, 2), "ops_ms": {k: round(v, 2) for k, v in ops.most_common()}}


def forms(w: torch.Tensor) -> dict[str, torch.nn.Module]:
    q, scale = quantize_int8_blockwise(w)
    return {
        "fp32": FloatMatmul(w),
        "fp16": FloatMatmul(w.half()),
        "int8": BlockwiseMatmul(q, scale),
        "int8-fp32-compute": BlockwiseMatmul(q, scale, compute_dtype=torch.float32),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=int, nargs=2, default=[768, 3072], metavar=("IN", "OUT"))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    p.add_argument("--calls", type=int, default=2)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    n_in, n_out = a.shape
    w = torch.randn(n_in, n_out, generator=torch.Generator().manual_seed(0)) / n_in**0.5
    results = []
    for rows in a.rows:
        x = np.random.default_rng(0).standard_normal((rows, n_in)).astype(np.float32)
        for name, module in forms(w).items():
            r = {"form": name, "in": n_in, "out": n_out, "rows": rows} | profiled_call(module, x, a.calls)
            r["ns_per_mac"] = round(1e6 * r["ms"] / (rows * n_in * n_out), 2)
            print(json.dumps(r), flush=True)
            results.append(r)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
