"""The weight bytes each recipe stores for a released size of every family, computed shape-only.

    python benchmarks/plan_sizes.py --json benchmarks/results/plan_sizes.json
    python benchmarks/plan_sizes.py qwen3.5-4b lfm2-8b-a1b --recipes int8keepproj int4

Each preset's decode module is built by the recipe's own `WeightBuilder` from meta tensors of
the preset's shapes: the builder quantizes, packs and records every tensor as it would in an
export, on no data, so a 35B model's plan takes seconds and no memory. The total is the
manifest's plan total for `ssmport export PRESET --synthetic --quant RECIPE`; the asset adds
the graph and metadata (~1 MB; `exporter.pipeline.ASSET_OVERHEAD`). tests/test_plan_sizes.py
holds the shape-only plan equal to the real build's on every tiny preset.

Not counted: an `auto` plan (it measures values); a tied checkpoint's table read from its head
(a float recipe on a real tied checkpoint stores the embedding once: `--synthetic` presets
generate the head apart from the table, so this plan counts both; the `tied` column says
which presets' released checkpoints tie them).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hybrid_speed import synthetic_model  # noqa: E402

from ssmport.architectures import LoadedModel  # noqa: E402
from ssmport.gate.reference import shape_only  # noqa: E402
from ssmport.quant import get_recipe  # noqa: E402
from ssmport.quant.plan import WeightBuilder, summarize_plan  # noqa: E402

# One released size per family (the phone-sized one where a family has several), MoE included.
PRESETS = ("rwkv7-1.5b", "rwkv6-1.6b", "mamba-1.4b", "mamba2-1.3b", "gated-deltanet-1.3b", "qwen3.5-4b", "lfm2-1.2b",
           "lfm3-1.7b", "granite-4.0-h-1b", "nemotron-h-4b", "falcon-h1-1.5b-base", "recurrentgemma-2b",
           "olmo-hybrid-7b", "lfm2-8b-a1b", "granite-4.0-h-tiny", "qwen3.5-35b-a3b", "nemotron-3-nano-30b-a3b")  # fmt: skip
RECIPES = ("fp32", "fp16", "int8keepproj", "int4keepproj", "int4")


def plan_entries(model: LoadedModel, recipe: str, meta: bool = True) -> list[dict]:
    """The manifest plan's entries of the recipe's build of `model`'s decode module, from meta
    tensors of its shapes (`meta`) or from its weights."""
    builder = WeightBuilder.for_architecture(get_recipe(recipe), model.architecture)
    weights = shape_only(model.weights) if meta else model.weights
    with torch.no_grad():
        model.architecture.build_decode(model.config, weights, builder, torch.float32)
    return builder.plan_json()


def plan_summary(model: LoadedModel, recipe: str) -> dict:
    return summarize_plan(plan_entries(model, recipe))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("presets", nargs="*", default=list(PRESETS))
    p.add_argument("--recipes", nargs="+", default=list(RECIPES))
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    rows = []
    print(f"{'preset':26}" + "".join(f"{r:>16}" for r in a.recipes) + "  tied", flush=True)
    for preset in a.presets:
        model = synthetic_model(preset)
        start = time.perf_counter()
        totals = {r: plan_summary(model, r) for r in a.recipes}
        tied = getattr(model.config, "tie_word_embeddings", None)
        rows.append({"preset": preset, "architecture": model.architecture.name, "tied": tied, "plans": totals,
                     "seconds": round(time.perf_counter() - start, 1)})  # fmt: skip
        print(f"{preset:26}" + "".join(f"{totals[r]['total']:16,}" for r in a.recipes) + f"  {tied}", flush=True)
    if a.json:
        a.json.write_text(json.dumps({"command": " ".join(sys.argv), "recipes": a.recipes, "models": rows}, indent=1))


if __name__ == "__main__":
    main()
