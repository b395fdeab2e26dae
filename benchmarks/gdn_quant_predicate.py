"""Which Gated DeltaNet weights can be int8: teacher-forced torch eager logits per predicate.

The same token streams are fed to the fp32 decode module and to int8 builds that keep
different weight roles in fp16; prints max |Δlogits| relative to the logit scale and top-1
agreement. `int8keepproj` is ssmport's predicate; the others move one role to int8.

    python benchmarks/gdn_quant_predicate.py [--preset gated-deltanet-tiny] [--steps 64]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from ssmport.models.gated_deltanet.quant import KEEP_FLOAT_ROLES
from ssmport.models.gated_deltanet.quant import role as _role
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.loader.resolve import load_model


def logits(model, recipe: str, keeps_float, tokens) -> np.ndarray:
    builder = WeightBuilder(get_recipe(recipe), keeps_float)
    module = model.architecture.build_decode(model.config, model.weights, builder, torch.float32).eval()
    with torch.no_grad():
        rows = [module(torch.tensor([[t]], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32)).float().reshape(-1)
                for t in tokens]  # fmt: skip
    return torch.stack(rows).numpy()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gated-deltanet-tiny")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--seeds", type=int, default=3, help="synthetic weight seeds")
    a = p.parse_args()
    variants = {
        "fp16 (no int8)": ("fp16", lambda n: True),
        "int8keepproj": ("int8keepproj", lambda n: _role(n) in KEEP_FLOAT_ROLES),
        "+ o_proj int8": ("int8keepproj", lambda n: _role(n) in KEEP_FLOAT_ROLES - {"out_proj"}),
        "+ q/k/v/a/b/g int8": ("int8keepproj", lambda n: _role(n) in KEEP_FLOAT_ROLES - {"state_proj"}),
        "int8 (all)": ("int8", lambda n: False),
    }
    print(f"{a.preset}, synthetic seeds 0..{a.seeds - 1}, {a.steps} teacher-forced tokens each, torch eager")
    print(f"{'variant':22} {'max rel |Δ|':>12} {'top-1':>10}")
    for label, (recipe, keep) in variants.items():
        worst, agree, total = 0.0, 0, 0
        for seed in range(a.seeds):
            model = load_model(a.preset, synthetic=True, seed=seed)
            tokens = np.random.default_rng(seed).integers(0, model.config.vocab_size, a.steps).tolist()
            ref = logits(model, "fp32", lambda n: True, tokens)
            got = logits(model, recipe, keep, tokens)
            worst = max(worst, float(np.abs(ref - got).max() / max(1.0, np.abs(ref).max())))
            agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
            total += len(tokens)
        print(f"{label:22} {worst:12.2e} {agree:>5}/{total}")


if __name__ == "__main__":
    main()
