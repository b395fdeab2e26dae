"""The 16-bit gates' noise floor of a preset on a gate's streams, in torch alone: the fp32
export-form module's logits, and the same weights in fp16 with this runtime's fp16 sums
(ssmport.gate.accumulation; what `ssmport gate` now computes before the bundle loads), their
distance relative to the logit scale, and the limit it gives each 16-bit recipe. No bundle is
built: this re-judges gate transcripts measured before the floor existed.

    python benchmarks/fp16_gate_floor.py rwkv7-0.1b qwen3.5-0.8b --json floors.json
"""

from __future__ import annotations

import argparse
import json
import time

from ssmport.gate.reference import recipe_with_runtime_sums, reference_logits
from ssmport.gate.report import default_prompts, streams_max_abs_delta
from ssmport.loader.resolve import DEFAULT_SEED, load_model
from ssmport.quant.recipes import RECIPES


def floor_of(preset: str, prompts: int, steps: int) -> dict:
    from ssmport.tokenizers import load_tokenizer

    model = load_model(preset, synthetic=True, seed=DEFAULT_SEED)
    # the streams `ssmport gate BUNDLE` feeds: the bundle's tokenizer is this file, copied or converted
    tokenizer = None if model.vocab_path is None else load_tokenizer(model.vocab_path)
    streams = default_prompts(model.config.vocab_size, prompts, steps, tokenizer=tokenizer)
    start = time.perf_counter()
    reference = reference_logits(model, streams)
    fp32_s = time.perf_counter() - start
    start = time.perf_counter()
    in_fp16 = reference_logits(model, streams, form=recipe_with_runtime_sums("fp16"))
    floor_s = time.perf_counter() - start
    scale = max(1.0, max(float(abs(r).max()) for r in reference))
    floor = streams_max_abs_delta(in_fp16, reference)
    limits = {name: max(r.gate.max_rel_logit_delta, r.gate.runtime_floor_factor * floor / scale)
              for name, r in RECIPES.items() if r.gate.runtime_floor_factor}  # fmt: skip
    return {"preset": preset, "streams": streams, "logit_scale": scale, "floor_abs": floor, "floor_rel": floor / scale,
            "limits": limits, "fp32_reference_s": fp32_s, "fp16_runtime_sums_s": floor_s}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presets", nargs="+")
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8, help="tokens per stream (the export gate's default: 8)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    out = []
    for preset in args.presets:
        f = floor_of(preset, args.prompts, args.steps)
        print(f"{preset}: floor {f['floor_rel']:.3e} of scale {f['logit_scale']:.4g}; limits "
              + ", ".join(f"{k} {v:.3g}" for k, v in f["limits"].items())
              + f"; fp32 reference {f['fp32_reference_s']:.1f} s, fp16 with this runtime's sums {f['fp16_runtime_sums_s']:.1f} s",
              flush=True)  # fmt: skip
        out.append(f)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
