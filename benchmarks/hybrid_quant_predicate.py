"""Which hybrid weights can be int8: teacher-forced torch eager logits per predicate.

For LFM2, Granite-4.0-H and Nemotron-H presets (synthetic weights): the same token streams
go through the fp32 decode module and through int8 builds that keep different weight roles
in fp16. Prints max |Δlogits| relative to the logit scale, top-1 agreement and the int8
share of the stored weight bytes. The first int8 row is the architecture's `int8keepproj`
predicate; each other row moves one role across.

    python benchmarks/hybrid_quant_predicate.py [--preset lfm2-tiny ...] [--steps 64] [--seeds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role
from ssmport.loader.resolve import load_model

PRESETS = ("lfm2-tiny", "granite-hybrid-tiny", "nemotron-h-tiny")


def logits(model, recipe: str, keeps_float, tokens) -> tuple[np.ndarray, float]:
    """Teacher-forced logits [T, V], and the int8 share of the stored bytes (scales included)."""
    builder = WeightBuilder(get_recipe(recipe), keeps_float)
    module = model.architecture.build_decode(model.config, model.weights, builder, torch.float32).eval()
    rows = []
    with torch.no_grad():
        for position, t in enumerate(tokens):
            ids, pos = torch.tensor([[t]], dtype=torch.int32), torch.tensor([[position]], dtype=torch.int32)
            rows.append(module(ids, pos).float().reshape(-1))
    share = sum(e.bytes for e in builder.entries if e.dtype == "int8") / sum(e.bytes for e in builder.entries)
    return torch.stack(rows).numpy(), share


def variants(arch) -> dict[str, tuple[str, object]]:
    """fp16, the predicate, the predicate with each matmul role it quantizes kept fp16 (or
    each one it keeps made int8), and int8 everywhere. The conv / SSM tensors are per-channel
    vectors, never int8, so they have no row."""
    keep, role = arch.keep_float_roles, arch.role
    out = {"fp16 (no int8)": ("fp16", lambda n: True), "int8keepproj": ("int8keepproj", lambda n: role(n) in keep)}
    for r in sorted({Role.OUT_PROJ, Role.ATTN_PROJ, Role.FFN, Role.HEAD} - keep):
        out[f"  + {r} kept fp16"] = ("int8keepproj", lambda n, r=r: role(n) in keep | {r})
    for r in sorted(keep & {Role.STATE_PROJ}):
        out[f"  - {r} int8"] = ("int8keepproj", lambda n, r=r: role(n) in keep - {r})
    out["int8 (all)"] = ("int8", lambda n: False)
    return out


def measure(preset: str, seeds: int, steps: int) -> dict[str, dict]:
    arch = load_model(preset, synthetic=True).architecture
    rows = {label: {"max_rel": 0.0, "top1": 0, "steps": 0} for label in variants(arch)}
    for seed in range(seeds):
        model = load_model(preset, synthetic=True, seed=seed)
        tokens = np.random.default_rng(seed).integers(0, model.config.vocab_size, steps).tolist()
        ref, _ = logits(model, "fp32", lambda n: True, tokens)
        for label, (recipe, keep) in variants(arch).items():
            (got, rows[label]["int8_share"]), row = logits(model, recipe, keep, tokens), rows[label]
            row["max_rel"] = max(row["max_rel"], float(np.abs(ref - got).max() / max(1.0, np.abs(ref).max())))
            row["top1"] += int((ref.argmax(-1) == got.argmax(-1)).sum())
            row["steps"] += len(tokens)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", action="append", help=f"repeatable; default {', '.join(PRESETS)}")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--seeds", type=int, default=3, help="synthetic weight seeds")
    p.add_argument("--json", help="also write the table here")
    a = p.parse_args()
    table = {}
    for preset in a.preset or PRESETS:
        print(f"\n{preset}, synthetic seeds 0..{a.seeds - 1}, {a.steps} teacher-forced tokens each, torch eager", flush=True)
        print(f"{'variant':28} {'max rel |Δ|':>12} {'top-1':>10} {'int8 share':>11}")
        table[preset] = measure(preset, a.seeds, a.steps)
        for label, r in table[preset].items():
            print(f"{label:28} {r['max_rel']:12.2e} {r['top1']:>5}/{r['steps']} {r['int8_share']:>10.0%}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": a.steps, "seeds": a.seeds, "results": table}, f, indent=2)


if __name__ == "__main__":
    main()
