"""Which quantized role makes a 16-bit recipe's own error (the recipe alone: its stored weights,
every sum in fp32)? The recipe, then the recipe with each named role kept float in turn, on a
preset's synthetic weights and the export gate's stream, each against the fp32 reference: max
|Δlogits| / scale and top-1 agreement. Torch only (no bundle); a measurement for choosing what a
recipe keeps in higher precision, not a gate.

    python benchmarks/recipe_role_split.py rwkv7-1.5b int8keepproj --roles head ffn --json out.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import numpy as np
from fp16_gate_floor import gate_streams, logit_scale, timed_logits

from ssmport.gate.reference import FP32, recipe_with_fp32_sums
from ssmport.gate.report import streams_max_abs_delta
from ssmport.loader.resolve import DEFAULT_SEED, load_model
from ssmport.quant import get_recipe
from ssmport.quant.recipes import FLOAT
from ssmport.quant.roles import Role


def _top1(logits, reference) -> tuple[int, int]:
    agree = sum(int((a.argmax(-1) == r.argmax(-1)).sum()) for a, r in zip(logits, reference))
    return agree, sum(len(r) for r in reference)


def role_split(preset: str, recipe_name: str, roles: list[str], prompts: int, steps: int) -> dict:
    model = load_model(preset, synthetic=True, seed=DEFAULT_SEED)
    streams = gate_streams(model, prompts, steps)
    reference, fp32_s = timed_logits(model, streams, FP32)
    scale = logit_scale(reference)
    recipe = get_recipe(recipe_name)
    variants = {recipe_name: recipe}
    for role in roles:
        kept = dataclasses.replace(recipe, name=f"{recipe_name}, {role} float",
                                   role_bits=(*recipe.role_bits, (role, FLOAT)))  # fmt: skip
        variants[kept.name] = kept
    rows, base = {}, None
    for name, variant in variants.items():
        alone, seconds = timed_logits(model, streams, recipe_with_fp32_sums(variant))
        agree, tokens = _top1(alone, reference)
        # bit-equal logits: the recipe stores no integer weight of that role in this model
        same = base is not None and all(np.array_equal(a, b) for a, b in zip(alone, base))
        base = alone if base is None else base
        rows[name] = {"recipe_alone_rel": streams_max_abs_delta(alone, reference) / scale, "top1": agree,
                      "tokens": tokens, "same_as_recipe": same, "seconds": seconds}  # fmt: skip
        print(f"{preset} {name}: the recipe alone {rows[name]['recipe_alone_rel']:.3g} of scale {scale:.4g}, "
              f"top-1 {agree}/{tokens} ({seconds:.0f} s)" + (" (the recipe's own logits: no integer weight of "
              "this role)" if same else ""), flush=True)  # fmt: skip
    return {"preset": preset, "streams": streams, "logit_scale": scale, "fp32_reference_s": fp32_s,
            "limit_rel": recipe.gate.max_rel_logit_delta, "variants": rows}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("recipe")
    ap.add_argument("--roles", nargs="+", required=True, choices=[r.value for r in Role],
                    help="roles to keep float, one at a time (ssmport.quant.roles)")
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8, help="tokens per stream (the export gate's default: 8)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    out = role_split(args.preset, args.recipe, args.roles, args.prompts, args.steps)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
