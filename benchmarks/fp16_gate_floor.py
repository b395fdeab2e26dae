"""The 16-bit gates' noise floor of a preset on a gate's streams, in torch alone: the fp32
export-form module's logits, and the same weights in fp16 with this runtime's fp16 sums
(ssmport.gate.accumulation; what `ssmport gate` now computes before the bundle loads), their
distance relative to the logit scale, and the limit it gives each 16-bit recipe. No bundle is
built: this re-judges gate transcripts measured before the floor existed. With --recipes, each
recipe's module also runs with fp32 sums (the recipe alone) and with this runtime's sums (the
bundle's computation in torch, its twin), and the verdict the gate's rule gives the twin is
printed: a prediction for bundles too slow to gate on this runtime, not a gate.

    python benchmarks/fp16_gate_floor.py rwkv7-0.1b qwen3.5-0.8b --json floors.json
    python benchmarks/fp16_gate_floor.py rwkv7-2.9b --recipes fp16 int8keepproj
"""

from __future__ import annotations

import argparse
import json
import time

from ssmport.gate.reference import FP32, recipe_with_fp32_sums, recipe_with_runtime_sums, reference_logits
from ssmport.gate.report import default_prompts, streams_max_abs_delta
from ssmport.loader.resolve import DEFAULT_SEED, load_model
from ssmport.quant.recipes import RECIPES


def timed_logits(model, streams, form) -> tuple[list, float]:
    start = time.perf_counter()
    return reference_logits(model, streams, form=form), time.perf_counter() - start


def gate_streams(model, prompts: int, steps: int) -> list[list[int]]:
    """The streams `ssmport gate BUNDLE` feeds: the bundle's tokenizer is the model's file, copied or converted."""
    from ssmport.tokenizers import load_tokenizer

    tokenizer = None if model.vocab_path is None else load_tokenizer(model.vocab_path)
    return default_prompts(model.config.vocab_size, prompts, steps, tokenizer=tokenizer)


def logit_scale(reference: list) -> float:
    """The gate's logit scale over every stream: the largest |logit| of the reference, at least 1."""
    return max(1.0, max(float(abs(r).max()) for r in reference))


def floor_of(preset: str, prompts: int, steps: int, recipes: list[str] = ()) -> dict:
    model = load_model(preset, synthetic=True, seed=DEFAULT_SEED)
    streams = gate_streams(model, prompts, steps)
    reference, fp32_s = timed_logits(model, streams, FP32)
    in_fp16, floor_s = timed_logits(model, streams, recipe_with_runtime_sums("fp16"))
    scale = logit_scale(reference)
    floor = streams_max_abs_delta(in_fp16, reference)
    limits = {name: max(r.gate.max_rel_logit_delta, r.gate.runtime_floor_factor * floor / scale)
              for name, r in RECIPES.items() if r.gate.runtime_floor_factor}  # fmt: skip
    predicted = {}
    for name in recipes:
        alone, alone_s = timed_logits(model, streams, recipe_with_fp32_sums(name))
        twin, twin_s = (in_fp16, 0.0) if name == "fp16" else timed_logits(model, streams, recipe_with_runtime_sums(name))
        alone_rel, twin_rel = streams_max_abs_delta(alone, reference) / scale, streams_max_abs_delta(twin, reference) / scale
        fixed = RECIPES[name].gate.max_rel_logit_delta
        predicted[name] = {"recipe_alone_rel": alone_rel, "twin_rel": twin_rel, "limit_rel": limits[name],
                           "passes": twin_rel <= limits[name] and alone_rel <= fixed,  # top-1 not judged here
                           "recipe_fp32_sums_s": alone_s, "recipe_runtime_sums_s": twin_s}  # fmt: skip
    return {"preset": preset, "streams": streams, "logit_scale": scale, "floor_abs": floor, "floor_rel": floor / scale,
            "limits": limits, "fp32_reference_s": fp32_s, "fp16_runtime_sums_s": floor_s, "predicted": predicted}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presets", nargs="+")
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8, help="tokens per stream (the export gate's default: 8)")
    ap.add_argument("--recipes", nargs="*", default=[], help="16-bit recipes whose twins to run and judge")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    out = []
    for preset in args.presets:
        f = floor_of(preset, args.prompts, args.steps, args.recipes)
        print(f"{preset}: floor {f['floor_rel']:.3e} of scale {f['logit_scale']:.4g}; limits "
              + ", ".join(f"{k} {v:.3g}" for k, v in f["limits"].items())
              + f"; fp32 reference {f['fp32_reference_s']:.1f} s, fp16 with this runtime's sums {f['fp16_runtime_sums_s']:.1f} s",
              flush=True)  # fmt: skip
        for name, p in f["predicted"].items():
            print(f"  {name}: twin {p['twin_rel']:.3g} of scale (limit {p['limit_rel']:.3g}), the recipe alone "
                  f"{p['recipe_alone_rel']:.3g}: {'PASS' if p['passes'] else 'FAIL'} by the rule (top-1 not judged; a "
                  f"prediction, not a gate)", flush=True)  # fmt: skip
        out.append(f)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
