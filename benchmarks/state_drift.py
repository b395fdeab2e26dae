"""Drift of an fp16-stored recurrent state against fp32, over a long teacher-forced run.

Same weights (fp32), same token stream; only the storage dtype of recState/shiftState
differs (the recurrence computes in fp32 either way). Reports, per window of tokens, the
max and mean |Δlogits| and top-1 agreement between the two, on the Core AI runtime (the
exported bundles) and/or torch eager.

    python benchmarks/state_drift.py --model rwkv7-0.1b --tokens 2048 --backend coreai
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
import torch

from ssmport.exporter.pipeline import export
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_model
from ssmport.gate.torch_runner import TorchRunner


def windows(a: np.ndarray, b: np.ndarray, size: int) -> list[dict]:
    rows = []
    for start in range(0, len(a), size):
        x, y = a[start : start + size], b[start : start + size]
        d = np.abs(x.astype(np.float64) - y)
        rows.append({
            "tokens": f"{start}-{start + len(x) - 1}",
            "max_abs": float(d.max()),
            "mean_abs": float(d.mean()),
            "top1_agree": int((x.argmax(-1) == y.argmax(-1)).sum()),
            "n": len(x),
            "logit_scale": float(np.abs(x).max()),
        })  # fmt: skip
    return rows


def run(model_spec: str, n_tokens: int, backend: str, window: int, seed: int) -> dict:
    model = load_model(model_spec, synthetic=True, seed=seed)
    tokens = np.random.default_rng(seed).integers(1, model.config.vocab_size, size=n_tokens).tolist()
    logits = {}
    timing = {}
    if backend == "torch":
        for sd in ("fp32", "fp16"):
            r = TorchRunner(model, "fp32", state_dtype=getattr(torch, {"fp32": "float32", "fp16": "float16"}[sd]))
            start = time.perf_counter()
            logits[sd] = r.step_each(tokens)
            timing[sd] = time.perf_counter() - start
    else:
        with tempfile.TemporaryDirectory() as tmp:
            for sd in ("fp32", "fp16"):
                res = export(model, tmp, quant="fp32", state_dtype=sd, gate=False, progress=False, name=f"drift-{sd}")
                with Runner(res.path) as r:
                    start = time.perf_counter()
                    logits[sd] = r.step_each(tokens)
                    timing[sd] = time.perf_counter() - start
    rows = windows(logits["fp32"], logits["fp16"], window)
    return {"model": model_spec, "synthetic": True, "backend": backend, "tokens": n_tokens,
            "seconds": timing, "windows": rows}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="rwkv7-0.1b")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--backend", choices=["coreai", "torch"], default="coreai")
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args()
    result = run(a.model, a.tokens, a.backend, a.window, a.seed)
    print(f"{a.model} (synthetic weights), {a.tokens} teacher-forced tokens on {a.backend}: fp16 state vs fp32 state")
    print(f"{'tokens':>12} {'max|Δ|':>9} {'mean|Δ|':>9} {'top-1':>9} {'scale':>7}")
    for w in result["windows"]:
        print(f"{w['tokens']:>12} {w['max_abs']:>9.4f} {w['mean_abs']:>9.5f} {w['top1_agree']:>4}/{w['n']:<4} {w['logit_scale']:>7.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
