"""One decode step of a routed-expert layer (4 of 32 experts, C=1024, F=768, fp32) on the Linux
Core AI runtime, with each way of reading only the chosen experts' weights (docs/hybrids.md,
section 9): `W[idx]` (aten.index, what ssmport uses), `torch.index_select`, an embedding-row
lookup on [E, in*out], and coreai-torch's `GatherMM` composite. Median ms per call.

    PYTHONPATH=$PWD python benchmarks/moe_gathers.py [W[idx] index_select embedding GatherMM]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from coreai_micro import call_times_ms  # noqa: E402

E, C, FE, K = 32, 1024, 768, 4


class Step(torch.nn.Module):
    def __init__(self, form: str):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.form = form
        self.router = torch.nn.Parameter(torch.randn(C, E, generator=g), requires_grad=False)
        gate_up, down = torch.randn(E, C, 2 * FE, generator=g) * C**-0.5, torch.randn(E, FE, C, generator=g) * FE**-0.5
        if form == "embedding":
            gate_up, down = gate_up.reshape(E, -1), down.reshape(E, -1)
        self.gate_up = torch.nn.Parameter(gate_up, requires_grad=False)
        self.down = torch.nn.Parameter(down, requires_grad=False)

    def _times(self, x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        """x [K, 1, in] times the chosen experts' w [K, in, out]."""
        if self.form == "GatherMM":
            from coreai_torch.composite_ops import GatherMM

            return GatherMM()(x, w, None, idx)
        if self.form == "embedding":
            return x @ F.embedding(idx, w).view(K, *shape)
        return x @ (torch.index_select(w, 0, idx) if self.form == "index_select" else w[idx])

    def forward(self, x):
        weights, idx = torch.topk(torch.sigmoid(x @ self.router), K, dim=-1)
        idx = idx.reshape(-1)
        g, u = self._times(x.reshape(1, 1, C).expand(K, 1, C), self.gate_up, idx, (C, 2 * FE)).split([FE, FE], -1)
        y = self._times(F.silu(g) * u, self.down, idx, (FE, C))
        return (y.reshape(K, C) * weights.reshape(K, 1)).sum(0, keepdim=True)


def main() -> None:
    x = np.random.default_rng(0).standard_normal((1, C)).astype(np.float32)
    for form in sys.argv[1:] or ["W[idx]", "index_select", "embedding", "GatherMM"]:
        print(f"{form:>12}: {np.median(call_times_ms(Step(form).eval(), x, 8)):8.2f} ms/call")


if __name__ == "__main__":
    main()
