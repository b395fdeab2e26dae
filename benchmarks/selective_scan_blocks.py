"""Mamba-1's two chunk forms at one layer's shape on the Core AI runtime, per block length c
(`ops.selective_scan.SUB_CHUNK`): ms per T-token call, against T calls of the decode read.
The pairwise form's work is T*c*I*N within blocks plus (T/c)^2*I*N between them; the stepped
form's ~T*I*N per step set, in c + T/c unrolled steps.

    python benchmarks/selective_scan_blocks.py --blocks 8 4 16 --calls 3
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import torch

from coreai_micro import call_times_ms  # benchmarks/ is on sys.path when run as a script
from ssmport.ops import selective_scan


class Chunk(torch.nn.Module):
    def __init__(self, I: int, N: int, T: int, form=None):
        super().__init__()
        self.form = form
        g = torch.Generator().manual_seed(0)
        self.A = -torch.exp(torch.rand(I, N, generator=g) * 3)
        self.h0, self.x = torch.randn(I, N, generator=g), torch.randn(T, I, generator=g)
        self.B, self.C = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
        self.valid = torch.tensor([T], dtype=torch.int32)

    def forward(self, dt):
        h, y = self.form(self.h0, dt.unsqueeze(-1) * self.A, dt * self.x, self.B, self.C, self.valid)
        return y.sum(0) + h.sum(-1)


class Decode(Chunk):
    def forward(self, dt):
        y, update = selective_scan.decode(self.h0, dt[0], self.A, dt[0] * self.x[0], self.B[0], self.C[0])
        return y + torch.exp(update.decay.rate.unsqueeze(-1) * update.decay.scale).sum(-1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--inner", type=int, default=1536)  # mamba-130m: I = 2 * 768
    ap.add_argument("--state", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--blocks", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--calls", type=int, default=5)
    a = ap.parse_args()
    I, N, T = a.inner, a.state, a.tokens
    dt = (0.1 * np.random.default_rng(0).random((T, I))).astype(np.float32)
    decode = statistics.median(call_times_ms(Decode(I, N, T), dt[:1], a.calls))
    print(f"I{I} N{N}: decode read {decode:.2f} ms per token; {T} tokens {T * decode:.1f} ms")
    for c in a.blocks:
        selective_scan.SUB_CHUNK = c
        for name, form in (("pairwise", selective_scan.chunk_pairwise), ("stepped", selective_scan.chunk)):
            ms = statistics.median(call_times_ms(Chunk(I, N, T, form), dt, a.calls))
            print(f"  c={c:3d} {name:8s}: chunk of {T} {ms:8.1f} ms ({ms / T:.2f} ms per token)", flush=True)


if __name__ == "__main__":
    main()
