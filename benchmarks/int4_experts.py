"""Are a mixture-of-experts model's expert projections safe at 4 bits? gate|up and down, each.

Each variant stores the routed experts' two stacks (gate|up [E, C, 2F] -- Nemotron-H's relu^2 experts: up [E, C, F] --, down [E, F, C]) as it
says and every other weight as its base recipe says, builds the decode module with the recipe's
`WeightBuilder` (the values the bundle stores) and runs it teacher-forced in torch with fp32
sums (`accumulation.accumulate_in_fp32`): the recipe's error, not this runtime's fp16 sums.
Against the fp32 torch reference on seeded token streams: max |Δlogits| / logit scale (the
gate's measure), mean |Δ|, top-1 agreement and flips where the reference's top-2 margin > 0.5.
Base "fp32" isolates the experts' own error ("experts float" is then fp32: the reference);
base "int4keepproj" is that recipe around them (its float is fp16).

    python benchmarks/int4_experts.py lfm2-moe-tiny qwen3.5-moe-tiny --json benchmarks/results/int4_experts_tiny.json

A checkpoint folder instead of a preset (e.g. the trained tests/data/lfm2_moe_pydoc) runs on its
own weights, on one stream: the held-out text (`accumulation.held_out_tokens`), --steps bytes.

    python benchmarks/int4_experts.py tests/data/lfm2_moe_pydoc --steps 241 \
        --json benchmarks/results/int4_experts_lfm2_moe_pydoc.json
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import torch

from accumulation import accumulate_in_fp32, compare, held_out_tokens, write_json
from ssmport.gate.report import default_prompts
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.loader.resolve import load_model
from ssmport.gate.torch_runner import TorchRunner

# name: (gate|up stack, down stack)
VARIANTS = {"experts float": ("float16", "float16"), "experts int8": ("int8", "int8"),
            "gate|up int4, down int8": ("int4", "int8"), "gate|up int8, down int4": ("int8", "int4"),
            "experts int4": ("int4", "int4")}  # fmt: skip


def expert_stacks(model) -> tuple[list[str], list[str]]:
    """The plan names of the input-side stacks (gate|up; Nemotron-H's relu^2 experts: up) and of
    the down stacks, every MoE layer: each layer builds its input-side stack, then its down one."""
    entries = TorchRunner(model, "int8").builder.entries
    stacks = [e.name for e in entries if e.rows_read is not None]
    return stacks[0::2], stacks[1::2]


def run_variant(model, base: str, gate_up: str, down: str, stacks, streams, refs) -> dict:
    per_tensor = tuple((n, gate_up) for n in stacks[0]) + tuple((n, down) for n in stacks[1])
    recipe = dataclasses.replace(get_recipe(base), per_tensor=per_tensor)
    runner = TorchRunner(model, "fp32")
    runner.builder = WeightBuilder.for_architecture(recipe, model.architecture)
    with torch.no_grad():
        runner.module = model.architecture.build_decode(model.config, model.weights, runner.builder, torch.float32).eval()
    accumulate_in_fp32(runner.module)
    got = []
    for s in streams:
        runner.reset()
        got.append(runner.step_each(s))
    return compare(np.concatenate(got), refs) | {"plan_bytes": sum(e.bytes for e in runner.builder.entries)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="MoE presets (synthetic weights) or checkpoint folders (their weights)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = {}
    for name in args.models:
        if Path(name).is_dir():
            model = load_model(name)
            streams = [held_out_tokens(model, args.steps)]
        else:
            model = load_model(name, synthetic=True)
            streams = default_prompts(model.config.vocab_size, args.streams, args.steps, seed=1)
        ref = TorchRunner(model, "fp32")
        refs = []
        for s in streams:
            ref.reset()
            refs.append(ref.step_each(s))
        refs = np.concatenate(refs).astype(np.float64)
        scale = max(1.0, float(np.abs(refs).max()))
        stacks = expert_stacks(model)
        results[name] = {"steps": len(refs), "logit_scale": scale, "variants": {}}
        print(f"{name}: {len(refs)} teacher-forced steps, logit scale {scale:.2f}, {len(stacks[0])} MoE layers")
        print(f"  {'base':13} {'variant':26} {'plan bytes':>10} {'max|Δ|/scale':>12} {'mean|Δ|':>8} {'top-1':>8} {'flips>0.5':>9}")
        for base in ("fp32", "int4keepproj"):
            for label, (gate_up, down) in VARIANTS.items():
                r = run_variant(model, base, gate_up, down, stacks, streams, refs)
                r["max_rel_delta"] = r["max_abs_delta"] / scale
                results[name]["variants"][f"{base}: {label}"] = r
                print(f"  {base:13} {label:26} {r['plan_bytes']:>10,} {r['max_rel_delta']:>12.4f} "
                      f"{r['mean_abs_delta']:>8.4f} {r['top1_agree']:>4}/{len(refs):<3} "
                      f"{r['confident_flips']:>4}/{r['confident_steps']}", flush=True)  # fmt: skip
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
