"""Mamba-2's decode readout S.C on the Core AI runtime: a batched matmul with one output
column against a product and a sum over N (ssmport.ops.ssd.decode), at released widths.

    PYTHONPATH=$PWD python benchmarks/ssd_readout.py [--presets mamba2-130m nemotron-h-4b] [--calls 40] [--json out.json]

Per preset, one layer's readout [G, H/G, P, N] . [G, N] -> [G, H/G, P], the state a runtime
input (as the state read from its stack is; a constant would let the converter fold work),
converted alone in each form and called `--calls` times after 3 untimed calls: the median
and minimum ms per call, the runtime's kernels per call (its Profiler, bookkeeping not
counted), and each form's largest distance from a float64 readout over the state's scale.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from coreai_micro import call_times_ms, loaded_main  # noqa: E402

DEFAULT_PRESETS = ("mamba2-130m", "granite-4.0-h-350m", "falcon-h1-0.5b-base", "nemotron-h-4b")


class Readout(torch.nn.Module):
    """y = S.C for the state S given as input; C a constant [G, N]. `form`: matmul | mul_sum."""

    def __init__(self, form: str, C: torch.Tensor, heads_per_group: int, head_dim: int):
        super().__init__()
        self.form, self.HG, self.P = form, heads_per_group, head_dim
        self.register_buffer("C", C)

    def forward(self, S: torch.Tensor) -> torch.Tensor:
        G, N = self.C.shape
        S = S.view(G, self.HG, self.P, N)
        if self.form == "matmul":  # the form before: [P, N] @ [N, 1] per head
            return (S @ self.C.view(G, 1, N, 1)).view(G, self.HG, self.P)
        return (S * self.C.view(G, 1, 1, N)).sum(-1)  # ssmport.ops.ssd.decode's


def kernels_per_call(module: torch.nn.Module, x: np.ndarray) -> int:
    from coreai.runtime import NDArray

    from ssmport.runtime.op_count import OpLog, summarize

    log = OpLog(keep=1)
    with loaded_main(module, x, [], profiler=log.profiler()) as (loop, fn):
        loop.run_until_complete(fn(inputs={"x": NDArray(x)}, state={}))
    return summarize(log.calls[-1]).ops


def geometry(preset: str) -> tuple[int, int, int, int]:
    """(G, H, P, N) of the preset's Mamba-2 mixer."""
    from ssmport.architectures import get_architecture, presets

    p = presets()[preset]
    m = get_architecture(p.architecture).config_from_json(dict(p.config)).mixer
    return m.n_groups, m.num_heads, m.head_dim, m.state_size


def measure(preset: str, calls: int) -> dict:
    G, H, P, N = geometry(preset)
    rng = np.random.default_rng(0)
    S = rng.standard_normal((G * (H // G), P, N)).astype(np.float32)
    C = torch.from_numpy(rng.standard_normal((G, N)).astype(np.float32))
    exact = (torch.from_numpy(S).double().view(G, H // G, P, N) @ C.double().view(G, 1, N, 1)).view(G, H // G, P)
    row = {"preset": preset, "G": G, "H": H, "P": P, "N": N, "state_bytes": S.nbytes, "forms": {}}
    for form in ("matmul", "mul_sum"):
        module = Readout(form, C, H // G, P)
        y = module(torch.from_numpy(S)).double()
        t = call_times_ms(module, S, calls)
        row["forms"][form] = {"median_ms": statistics.median(t), "min_ms": min(t), "kernels": kernels_per_call(module, S),
                              "max_abs_vs_fp64_of_scale": float((y - exact).abs().max() / exact.abs().max())}  # fmt: skip
    return row


def main() -> None:
    warnings.simplefilter("ignore")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=list(DEFAULT_PRESETS))
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    rows = []
    print("| preset | G, H, P, N | state per layer | matmul: ms median (min), kernels | mul_sum: ms median (min), kernels | "
          "matmul / mul_sum | vs fp64, of scale (matmul / mul_sum) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for preset in a.presets:
        r = measure(preset, a.calls)
        rows.append(r)
        m, s = r["forms"]["matmul"], r["forms"]["mul_sum"]
        print(f"| {preset} | {r['G']}, {r['H']}, {r['P']}, {r['N']} | {r['state_bytes'] / 1e6:.2f} MB | "
              f"{m['median_ms']:.3f} ({m['min_ms']:.3f}), {m['kernels']} | {s['median_ms']:.3f} ({s['min_ms']:.3f}), "
              f"{s['kernels']} | {m['median_ms'] / s['median_ms']:.2f}x | {m['max_abs_vs_fp64_of_scale']:.1e} / "
              f"{s['max_abs_vs_fp64_of_scale']:.1e} |", flush=True)  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
