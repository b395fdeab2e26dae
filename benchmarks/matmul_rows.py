"""How this runtime's fp32 many-row matmul `x [R, in] @ W [in, out]` scales with R and form
(what the prefill graphs run): plain, split into row groups of r (`[R/r, r, in] @ W`),
transposed (`(W^T x^T)^T`), and column blocks of 1024 (`[1, R, in] @ [blocks, in, 1024]`).

    python benchmarks/matmul_rows.py --shapes 2048x2048,2048x8192 --rows 1,16,64

Prints the best of --calls calls per variant as ms per row (lower is better).
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch

from coreai_micro import call_times_ms  # benchmarks/ is on sys.path when run as a script


class Plain(torch.nn.Module):
    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.w = torch.nn.Parameter(w, requires_grad=False)

    def forward(self, x):
        return x @ self.w


class RowGroups(Plain):
    def __init__(self, w: torch.Tensor, group: int):
        super().__init__(w)
        self.group = group

    def forward(self, x):
        rows = x.shape[0]
        return (x.reshape(rows // self.group, self.group, -1) @ self.w).reshape(rows, -1)


class Transposed(Plain):
    def forward(self, x):
        return (self.w.t() @ x.t()).t()


class ColumnBlocks(torch.nn.Module):
    def __init__(self, w: torch.Tensor, width: int = 1024):
        super().__init__()
        n_in, n_out = w.shape
        blocks = max(1, n_out // width)
        self.w = torch.nn.Parameter(w.reshape(n_in, blocks, n_out // blocks).permute(1, 0, 2).contiguous(), requires_grad=False)

    def forward(self, x):
        rows = x.shape[0]
        y = x.reshape(1, rows, -1) @ self.w
        return y.permute(1, 0, 2).reshape(rows, -1)


def main() -> None:
    warnings.simplefilter("ignore", FutureWarning)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="2048x2048,2048x8192,8192x2048")
    p.add_argument("--rows", default="1,8,16,32,64")
    p.add_argument("--groups", default="8,16")
    p.add_argument("--calls", type=int, default=5)
    a = p.parse_args()
    for shape in a.shapes.split(","):
        n_in, n_out = (int(v) for v in shape.split("x"))
        w = torch.randn(n_in, n_out, generator=torch.Generator().manual_seed(0)) * 0.02
        for rows in (int(r) for r in a.rows.split(",")):
            x = np.random.default_rng(0).random((rows, n_in), dtype=np.float32)
            variants = {"plain": Plain(w), "transposed": Transposed(w), "blocks1024": ColumnBlocks(w)}
            for g in (int(v) for v in a.groups.split(",")):
                if rows > g and rows % g == 0:
                    variants[f"groups{g}"] = RowGroups(w, g)
            cells = []
            for name, module in variants.items():
                ms = min(call_times_ms(module, x, a.calls))
                cells.append(f"{name} {ms / rows:7.3f}")
            print(f"{shape:10} R={rows:3d}  ms/row: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
