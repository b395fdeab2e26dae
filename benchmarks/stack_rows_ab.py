"""`stack_rows` as one concat (the default) against a chain of scatters, per preset: runtime
kernels per decode call (what a GPU dispatches) and decode ms/token on this runtime.

`ssmport.ops.rows.stack_rows` stacks each layer's small rows (the deferred update's vectors,
conv windows, shift rows) into one [L, numel] tensor with one concat. Until this measurement it
was L `index_copy` scatters, because a concat lowered slower per byte on the Linux Core AI
runtime; on a GPU each scatter is a dispatch, a concat one. This script exports each preset
twice (synthetic fp32, no prefill, no gate), the scatter variant with `stack_rows` swapped for
the chain in every module that uses it, and times the two bundles' decode alternately
(--rounds passes of --steps tokens each), so machine load hits both alike.

    python benchmarks/stack_rows_ab.py mamba2-tiny gated-deltanet-tiny rwkv7-tiny [--rounds 4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from ssmport.bench import bench_tokens, step_times_ms
from ssmport.bundle import Bundle
from ssmport.exporter.pipeline import export
from ssmport.runtime import Runner
from ssmport.runtime.op_count import count_ops

USERS = ("ssmport.ops.rows", "ssmport.ops.deferred", "ssmport.graph", "ssmport.state")


def stack_rows_scatter(pieces: list[torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The former stack_rows: L scatters into zeros, one per row."""
    out = torch.zeros(len(pieces), pieces[0].numel(), dtype=dtype)
    for i, piece in enumerate(pieces):
        out = out.index_copy(0, torch.tensor([i]), piece.reshape(1, -1).to(dtype))
    return out


@contextlib.contextmanager
def scatter_stacking():
    import importlib

    modules = [importlib.import_module(m) for m in USERS]
    saved = [m.stack_rows for m in modules]
    for m in modules:
        m.stack_rows = stack_rows_scatter
    try:
        yield
    finally:
        for m, f in zip(modules, saved):
            m.stack_rows = f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presets", nargs="+")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for preset in a.presets:
            bundles = {}
            for variant, ctx in (("scatter", scatter_stacking()), ("concat", contextlib.nullcontext())):
                with ctx:
                    r = export(preset, Path(work) / variant, synthetic=True, quant="fp32", gate=False, prefill_chunk=None,
                               progress=False, overwrite=True)  # fmt: skip
                bundles[variant] = Bundle.open(r.path)
            tokens = bench_tokens(bundles["scatter"].manifest.vocab_size, a.steps + 4)
            # the two bundles compute the same logits: the swap changes how rows are stacked, not what
            outs = {}
            for variant, b in bundles.items():
                with Runner(b) as runner:
                    outs[variant] = np.stack([runner.step(t) for t in tokens[:8]])
            assert np.array_equal(outs["scatter"], outs["concat"]), "the variants disagree"
            times = {v: [] for v in bundles}
            runners = {v: Runner(b) for v, b in bundles.items()}
            try:
                for _ in range(a.rounds):
                    for v, runner in runners.items():
                        times[v] += step_times_ms(runner.step, runner.reset, tokens, 4)
            finally:
                for runner in runners.values():
                    runner.close()
            row = {}
            for v, b in bundles.items():
                ops = count_ops(b)["main"]
                row[v] = {"kernels": ops.ops, "bookkeeping": ops.bookkeeping, "ms_per_token": float(np.median(times[v])),
                          "scatter_nd": ops.by_type.get("scatter_nd", 0), "concat": ops.by_type.get("concat", 0)}  # fmt: skip
            results[preset] = row
            print(f"{preset}: " + "; ".join(f"{v} {r['kernels']} kernels (+{r['bookkeeping']} bookkeeping), "
                                           f"{r['ms_per_token']:.2f} ms/token" for v, r in row.items()), flush=True)  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
