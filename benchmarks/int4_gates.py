"""Each tiny preset's default export gate under the 4-bit recipes: the measurement behind their
gate limits (ssmport/quant/recipes.py). Synthetic weights, decode-only bundles, Core AI runtime.

    python benchmarks/int4_gates.py --json benchmarks/results/int4_gates_tiny.json
"""

from __future__ import annotations

import argparse
import tempfile
import time

from accumulation import write_json
from ssmport.exporter.pipeline import export

PRESETS = ("rwkv7-tiny", "mamba2-tiny", "gated-deltanet-tiny", "qwen3.5-tiny", "lfm2-tiny", "granite-hybrid-tiny",
           "nemotron-h-tiny")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", nargs="+", default=["int4keepproj", "int4"])
    ap.add_argument("--presets", nargs="+", default=list(PRESETS))
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as out:
        for preset in args.presets:
            for recipe in args.recipes:
                started = time.perf_counter()
                result = export(preset, out, quant=recipe, progress=False, prefill_chunk=None, overwrite=True)
                g = result.manifest.gate
                row = {"passed": g.passed, "max_rel_logit_delta": g.max_rel_logit_delta, "top1_agree": g.top1_agree,
                       "excused_ties": g.top1_excused_ties, "missed": g.top1_mismatch, "steps": g.steps * g.prompts,
                       "asset_bytes": result.manifest.asset.bytes}  # fmt: skip
                results[f"{preset} {recipe}"] = row
                print(f"{preset:20} {recipe:13} {'PASS' if g.passed else 'FAIL'}  max|Δ|/scale {g.max_rel_logit_delta:.4f}  "
                      f"top-1 {g.top1_agree} + {g.top1_excused_ties} ties, {g.top1_mismatch} missed  "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)  # fmt: skip
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
