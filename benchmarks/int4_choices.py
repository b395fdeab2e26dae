"""The measurements behind the 4-bit recipes: symmetric vs affine blocks, and the LM head's width.

Each variant's weights are built by its recipe's `WeightBuilder` (the values the bundle
stores) and run teacher-forced in torch with fp32 sums (`accumulation.accumulate_in_fp32`),
so what is measured is the recipe, not this runtime's fp16 accumulation. Against the fp32
torch reference: max |Δlogits| / logit scale (the gate's measure), mean |Δ|, top-1 flips
where the reference's top-2 margin exceeds 0.5, and the plan's bytes.

    python benchmarks/int4_choices.py rwkv7-pydoc --steps 241 --json benchmarks/results/int4_choices_rwkv7-pydoc.json
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import torch

from accumulation import write_json, accumulate_in_fp32, compare, held_out_tokens
from ssmport.loader.pretrained import BUNDLED
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.loader.resolve import load_model
from ssmport.gate.torch_runner import TorchRunner

# name: (base recipe, overrides of its fields)
VARIANTS = {
    "int8keepproj": ("int8keepproj", {}),
    "int4keepproj sym, head int4": ("int8keepproj", {"bits": 4}),
    "int4keepproj sym, head int8": ("int8keepproj", {"bits": 4, "role_bits": (("head", 8),)}),
    "int4keepproj sym, head fp16": ("int8keepproj", {"bits": 4, "role_bits": (("head", None),)}),
    "int4keepproj affine, head int4": ("int8keepproj", {"bits": 4, "zero_point": True}),
    "int4keepproj affine, head int8": ("int8keepproj", {"bits": 4, "zero_point": True, "role_bits": (("head", 8),)}),
    "int4kp affine, head int8, r/k/v/o int8": ("int8keepproj", {"bits": 4, "zero_point": True, "role_bits": (("head", 8),),
                                                 "kept_bits": (("state_proj", 8),)}),
    "int4kp sym, head int8, r/k/v/o int8": ("int8keepproj", {"bits": 4, "role_bits": (("head", 8),),
                                              "kept_bits": (("state_proj", 8),)}),
    "int4kp sym, head int8, r/k/v/o+lora int8": ("int8keepproj", {"bits": 4, "role_bits": (("head", 8),),
                                                   "kept_bits": (("state_proj", 8), ("lora", 8))}),
    "int4 sym (every matmul)": ("int8", {"bits": 4}),
    "int4 affine (every matmul)": ("int8", {"bits": 4, "zero_point": True}),
}


def run_variant(model, base: str, overrides: dict, tokens: list[int], ref: np.ndarray) -> dict:
    recipe = dataclasses.replace(get_recipe(base), **overrides)
    runner = TorchRunner(model, base)
    runner.builder = WeightBuilder.for_architecture(recipe, model.architecture)
    with torch.no_grad():
        runner.module = model.architecture.build_decode(model.config, model.weights, runner.builder, torch.float32).eval()
    accumulate_in_fp32(runner.module)
    result = compare(runner.step_each(tokens), ref)
    result["plan_bytes"] = sum(e.bytes for e in runner.builder.entries)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="rwkv7-pydoc (trained) or a preset, with --synthetic weights")
    ap.add_argument("--steps", type=int, default=241)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.model, synthetic=args.model not in BUNDLED)
    tokens = held_out_tokens(model, args.steps)
    ref = TorchRunner(model, "fp32").step_each(tokens).astype(np.float64)
    scale = max(1.0, float(np.abs(ref).max()))
    results = {"model": args.model, "synthetic": model.synthetic, "steps": len(tokens), "logit_scale": scale,
               "variants": {}}  # fmt: skip
    print(f"{args.model}: {len(tokens)} teacher-forced tokens, logit scale {scale:.2f} (torch, fp32 sums)")
    print(f"{'variant':34} {'plan bytes':>11} {'max|Δ|/scale':>12} {'mean|Δ|':>8} {'top-1':>8} {'flips>0.5':>9}")
    for name, (base, overrides) in VARIANTS.items():
        r = run_variant(model, base, overrides, tokens, ref)
        r["max_rel_delta"] = r["max_abs_delta"] / scale
        results["variants"][name] = r
        print(f"{name:34} {r['plan_bytes']:>11,} {r['max_rel_delta']:>12.4f} {r['mean_abs_delta']:>8.4f} "
              f"{r['top1_agree']:>4}/{len(tokens):<3} {r['confident_flips']:>4}/{r['confident_steps']}", flush=True)  # fmt: skip
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
