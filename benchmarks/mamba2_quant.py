"""Which Mamba-2 (and Mamba-1) matmuls tolerate int8: the measurement behind `mamba2.KEEP_FLOAT_ROLES`
and `mamba1.KEEP_FLOAT_ROLES` (each model's roles come from its own architecture).

Torch eager, teacher-forced against the fp32 build of the same weights, one variant per
candidate predicate: the error of the weights alone (the Core AI runtime adds fp16
accumulation on top, see docs/parity.md).

    python benchmarks/mamba2_quant.py mamba2-tiny --seed 0
    python benchmarks/mamba2_quant.py mamba2-130m --synthetic --streams 2 --steps 32
    python benchmarks/mamba2_quant.py mamba-130m-hf --synthetic --streams 2 --steps 32
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.loader.resolve import load_model

# name -> (recipe, roles that stay float); None = the recipe's own rule (no keep set)
VARIANTS = {
    "fp16": ("fp16", None),
    "int8 head": ("int8keepproj", {"state_proj", "out_proj", "ssm", "norm", "embedding"}),
    "int8 head+out_proj": ("int8keepproj", {"state_proj", "ssm", "norm", "embedding"}),
    "int8 out_proj only": ("int8keepproj", {"state_proj", "head", "ssm", "norm", "embedding"}),
    "int8 head+state_proj": ("int8keepproj", {"out_proj", "ssm", "norm", "embedding"}),
    "int8 all": ("int8", None),
}


def run(model, recipe: str, keep: set[str] | None, streams: list[list[int]]) -> np.ndarray:
    predicate = (lambda name: model.architecture.role(name) in keep) if keep is not None else model.architecture.keeps_float
    builder = WeightBuilder(get_recipe(recipe), predicate)
    with torch.no_grad():
        module = model.architecture.build_decode(model.config, model.weights, builder, torch.float32).eval()
        rows = []
        for tokens in streams:
            module.convState.zero_()
            module.ssmState.zero_()
            for t in tokens:
                rows.append(module(torch.tensor([[t]], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32)).float().reshape(-1))
    int8_bytes = sum(e["bytes"] for e in builder.plan_json() if e["dtype"] == "int8")
    total = sum(e["bytes"] for e in builder.plan_json())
    return torch.stack(rows).numpy().astype(np.float64), int8_bytes, total


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--synthetic", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--steps", type=int, default=48)
    args = p.parse_args()
    model = load_model(args.model, synthetic=args.synthetic, seed=args.seed)
    rng = np.random.default_rng(0)
    streams = [rng.integers(1, model.config.vocab_size, size=args.steps).tolist() for _ in range(args.streams)]
    ref, _, _ = run(model, "fp32", None, streams)
    scale = max(1.0, np.abs(ref).max())
    top2 = np.sort(ref, axis=1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    print(f"{args.model} seed {args.seed}: {len(streams)} streams x {args.steps} steps, logit scale {scale:.3g}")
    print(f"{'variant':20} {'max|Δ|/scale':>12} {'p50|Δ|':>8} {'flips':>5} {'max flip margin':>15} {'int8 share':>10}")
    for name, (recipe, keep) in VARIANTS.items():
        got, int8_bytes, total = run(model, recipe, keep, streams)
        delta = np.abs(got - ref).max(axis=1)
        flips = got.argmax(1) != ref.argmax(1)
        worst = f"{margin[flips].max():.3f}" if flips.any() else "-"
        print(f"{name:20} {delta.max() / scale:12.2e} {np.median(delta):8.4f} {int(flips.sum()):5d} {worst:>15} "
              f"{int8_bytes / total:10.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
