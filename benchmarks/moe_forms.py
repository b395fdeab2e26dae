"""The routed-expert layer's forms on the Linux Core AI runtime (docs/hybrids.md, "Routed experts"):
one `ExpertMixture` (ssmport.models.moe) at LFM2-8B-A1B's routing (4 of 32 experts, sigmoid,
expert bias) with smaller experts, timed per call for T = 1 (decode) and prefill chunks, in
the gathered form (a gather W[idx] of the chosen experts' stacked weights + batched matmul) and
the dense form (every expert over the chunk, a dense [T, E] routing matrix), and the branched
form (`--experts branched`: an `if` per expert, taken when some token chose it, reading W[e] in
place over all T rows); with the runtime's op count per call and the expert weight bytes each
form reads.

    PYTHONPATH=$PWD python benchmarks/moe_forms.py [--hidden 1024 --width 768 --experts 32 --top-k 4 --forms gather dense branch]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from coreai_micro import call_times_ms  # noqa: E402

from ssmport.loader.checkpoint import GeneratedSource  # noqa: E402
from ssmport.models import moe  # noqa: E402
from ssmport.quant import get_recipe  # noqa: E402
from ssmport.quant.plan import WeightBuilder  # noqa: E402


class Form(torch.nn.Module):
    def __init__(self, mixture: moe.ExpertMixture, form: str):
        super().__init__()
        self.m, self.form = mixture, form

    def forward(self, x):
        chosen, weights = moe.route(self.m.spec, x @ self.m.router, self.m.bias)
        return {"dense": self.m._dense, "gather": self.m._gathered, "branch": self.m._branched}[self.form](x, chosen, weights)


def ops_per_call(module: torch.nn.Module, x: torch.Tensor) -> int:
    import coreai_torch

    ep = torch.export.export(module.eval(), (x,)).run_decompositions(coreai_torch.get_decomp_table())
    return sum(1 for n in ep.graph.nodes if n.op == "call_function")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 64])
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--forms", nargs="+", default=["gather", "dense", "branch"])
    a = ap.parse_args()
    spec = moe.MoeSpec(a.experts, a.top_k, a.width, moe.SIGMOID, True, 1e-6, 1.0, True)
    names = moe.MoeNames("gate", ("e{e}.w1", "e{e}.w3", "e{e}.w2"), bias="bias")
    src = GeneratedSource(moe.moe_shapes(spec, names, a.hidden), 0, lambda n, s, g: torch.randn(s, generator=g) * s[-1] ** -0.5)
    mixture = moe.ExpertMixture(spec, names, src, WeightBuilder(get_recipe("fp32"), lambda n: False))
    expert_bytes = 3 * a.hidden * a.width * 4
    print(f"C={a.hidden} F={a.width} {spec.describe()}: {expert_bytes / 1e6:.1f} MB per expert (fp32)")
    for T in a.rows:
        x = np.random.default_rng(T).standard_normal((T, a.hidden)).astype(np.float32)
        with torch.no_grad():
            taken = len(moe.route(spec, torch.from_numpy(x) @ mixture.router, mixture.bias)[0].unique())
        for name in a.forms:
            form = Form(mixture, name)
            ms = call_times_ms(form, x, a.calls)
            read = {"dense": a.experts, "branch": taken}.get(name, T * a.top_k)  # gather: a copy per token and choice
            print(f"T={T:3d} {name:6}: {np.median(ms):8.2f} ms/call  "
                  f"{ops_per_call(form, torch.from_numpy(x)):3d} ops  expert weights read {read * expert_bytes / 1e6:7.1f} MB", flush=True)


if __name__ == "__main__":
    main()
