"""Long runs on the Core AI runtime: no NaN/Inf under any recipe, and fp16-state drift.

1. Every recipe (fp32, fp16, int8keepproj, int8) decodes the same teacher-forced token
   stream for --tokens steps; every logit and the final states must be finite. Each recipe is
   also compared with the fp32 bundle per window (max |Δlogits|, top-1 agreement).
2. fp16 vs fp32 storage of the recurrent state (fp32 weights, the recurrence computes in fp32
   either way): max |Δlogits| and top-1 agreement per window of --window steps.

The model is rwkv7-tiny's shape with a 320-token vocabulary (synthetic weights, seed 0): on
this Linux runtime fp16 compute is emulated and int8 weights are dequantized on every call,
so the 65,536-row output layer of the real vocabulary makes fp16/int8 runs ~20x slower
(0.8-1.8 s/token); with --vocab 65536 only fp32 is practical.

    python benchmarks/long_run_drift.py --tokens 10000 --json benchmarks/results/long_run_drift.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ssmport.architectures import LoadedModel
from ssmport.exporter.pipeline import export
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_model

sys.path.insert(0, str(Path(__file__).parent))
from state_drift import windows  # noqa: E402  (same per-window statistics)

RECIPES = ("fp32", "fp16", "int8keepproj", "int8")


def small_model(vocab: int, seed: int) -> LoadedModel:
    base = load_model("rwkv7-tiny", synthetic=True, seed=seed)
    cfg = dataclasses.replace(base.config, vocab_size=vocab)
    arch = base.architecture
    return LoadedModel(arch, cfg, arch.synthetic_weights(cfg, seed),
                       {"kind": "synthetic", "preset": f"rwkv7-tiny (vocab {vocab})", "seed": seed},
                       name=f"rwkv7-tiny-v{vocab}")  # fmt: skip


def decode(bundle: Path, tokens: list[int]) -> tuple[np.ndarray, bool, float]:
    """(logits [T, V], whether the final states are finite, seconds)."""
    with Runner(bundle) as r:
        start = time.perf_counter()
        logits = r.step_each(tokens)
        seconds = time.perf_counter() - start
        states_finite = all(np.isfinite(r.state(n)).all() for n in r.state_names)
    return logits, states_finite, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=10_000)
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--vocab", type=int, default=320)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--recipes", default=",".join(RECIPES))
    p.add_argument("--json", help="write the results here (updated after every run)")
    a = p.parse_args()
    model = small_model(a.vocab, a.seed)
    tokens = np.random.default_rng(a.seed).integers(1, a.vocab, size=a.tokens).tolist()
    result = {"model": model.name, "config": model.config.to_json(), "synthetic": True, "tokens": a.tokens,
              "window": a.window, "recipes": {}, "fp16_state_vs_fp32_state": None}  # fmt: skip

    def save() -> None:
        if a.json:
            Path(a.json).write_text(json.dumps(result, indent=2) + "\n")

    recipes = a.recipes.split(",")
    runs = [("fp32", "fp32"), ("fp32", "fp16")] + [(q, "fp32") for q in recipes if q != "fp32"]
    logits = {}
    with tempfile.TemporaryDirectory() as tmp:
        for recipe, state in runs:
            res = export(model, tmp, quant=recipe, state_dtype=state, gate=False, progress=False,
                         name=f"{recipe}-state-{state}")  # fmt: skip
            out, states_finite, seconds = decode(res.path, tokens)
            logits[(recipe, state)] = out
            entry = {"state_dtype": state, "seconds": round(seconds, 1), "logits_finite": bool(np.isfinite(out).all()),
                     "states_finite": states_finite, "max_abs_logit": float(np.abs(out).max())}  # fmt: skip
            if (recipe, state) != ("fp32", "fp32") and ("fp32", "fp32") in logits:
                entry["vs_fp32"] = windows(logits[("fp32", "fp32")], out, a.window)
            if state == "fp16":
                result["fp16_state_vs_fp32_state"] = entry
            else:
                result["recipes"][recipe] = entry
            print(f"{recipe:13} state {state}: {a.tokens} tokens in {seconds:.0f} s, logits finite "
                  f"{entry['logits_finite']}, states finite {states_finite}", flush=True)  # fmt: skip
            save()
    drift = result["fp16_state_vs_fp32_state"]
    if drift:
        print(f"fp16 state vs fp32 state ({model.name}, fp32 weights), per {a.window} steps:")
        print(f"{'steps':>12} {'max|Δ|':>9} {'mean|Δ|':>9} {'top-1':>11} {'scale':>7}")
        for w in drift["vs_fp32"]:
            print(f"{w['tokens']:>12} {w['max_abs']:>9.2e} {w['mean_abs']:>9.2e} {w['top1_agree']:>5}/{w['n']:<5} {w['logit_scale']:>7.2f}")  # fmt: skip
    bad = [q for q, e in result["recipes"].items() if not (e["logits_finite"] and e["states_finite"])]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
