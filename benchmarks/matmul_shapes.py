"""How fast the Linux Core AI runtime streams an fp32 `x @ W` (one token) by weight shape and
form: plain `[in, out]`, the weight transposed (`W^T x`), and ssmport's column blocks.

    python benchmarks/matmul_shapes.py
    python benchmarks/matmul_shapes.py --blockings 3136x17504:32,16 2560x10576:16,8 --calls 30

`--blockings IN x OUT:B1,B2,..`: the same weight as B1, B2, .. column blocks each (alternated
twice), against the block count ssmport chooses (`out_blocks`).

Prints the best of --calls calls per variant, as ms and as GB/s of weight read, next to the
single-thread read bandwidth measured by `ssmport.bench.measure_read_bandwidth`.
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch

from ssmport.bench import measure_read_bandwidth
from ssmport.ops.matmul import OUT_BLOCK, FloatMatmul, out_blocks

from coreai_micro import call_times_ms  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


class Plain(torch.nn.Module):
    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.w = torch.nn.Parameter(w, requires_grad=False)

    def forward(self, x):
        return x @ self.w


class Transposed(torch.nn.Module):  # W stored [out, in], applied as W x
    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.w = torch.nn.Parameter(w.t().contiguous(), requires_grad=False)

    def forward(self, x):
        return (self.w @ x.view(-1, 1)).view(1, -1)


def blockings(spec: str, calls: int) -> None:
    shape, counts = spec.split(":")
    n_in, n_out = (int(v) for v in shape.split("x"))
    w = torch.randn(n_in, n_out, generator=torch.Generator().manual_seed(0)) * 0.02
    for blocks in [int(b) for b in counts.split(",")] * 2:
        ms = best_ms(FloatMatmul(w, blocks=blocks), n_in, calls)
        chosen = "  (out_blocks)" if blocks == out_blocks(n_out) else ""
        print(f"{shape:12} {blocks:4d} x {n_out // blocks:5d}: {ms:7.2f} ms {w.numel() * 4 / 1e9 / ms * 1e3:5.1f} GB/s{chosen}", flush=True)


def best_ms(module: torch.nn.Module, n_in: int, calls: int) -> float:
    x = np.random.default_rng(0).random((1, n_in), dtype=np.float32)
    return min(call_times_ms(module, x, calls))


def main() -> None:
    warnings.simplefilter("ignore", FutureWarning)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="768x3072,3072x768,2048x2048,2048x8192,8192x2048,768x65536,2048x65536")
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--blockings", nargs="+", metavar="INxOUT:B1,B2", help="compare block counts of these shapes only")
    a = p.parse_args()
    if a.blockings:
        for spec in a.blockings:
            blockings(spec, a.calls)
        return
    print(f"single-thread read bandwidth: {measure_read_bandwidth():.1f} GB/s; column block width {OUT_BLOCK}")
    print(f"{'shape [in x out]':18} {'x @ W':>16} {'W^T x':>16} {'column blocks':>16}")
    for shape in a.shapes.split(","):
        n_in, n_out = (int(v) for v in shape.split("x"))
        w = torch.randn(n_in, n_out, generator=torch.Generator().manual_seed(0)) * 0.02
        gb = w.numel() * 4 / 1e9
        cells = []
        for module in (Plain(w), Transposed(w), FloatMatmul(w)):
            ms = best_ms(module, n_in, a.calls)
            cells.append(f"{ms:7.2f} ms {gb / ms * 1e3:5.1f}")
        blocks = FloatMatmul(w).blocks
        print(f"{shape:18} " + " ".join(f"{c:>16}" for c in cells) + ("" if blocks > 1 else "  (not blocked)"))
    print("cells: best ms per call, GB/s of weight read")


if __name__ == "__main__":
    main()
