"""A trained mixture of experts (tests/data/*_moe_pydoc) under each recipe, on held-out bytes.

For each recipe this exports a decode-only bundle with the export's own gate (default: 8
steps on the Core AI runtime) and runs it teacher-forced on held-out text (the shipped
rwkv7-pydoc `validation.txt`: a file of the same split that neither model saw) against the fp32
torch reference: asset bytes, gate verdict and max |Δ| / logit scale, and on the held-out
bytes max |Δ| / scale, top-1 agreement, flips where the reference's top-2 margin > 0.5. Routing
flips are counted on the recipe's torch twin (the values the bundle stores, fp32 sums;
`int4_ablation.run_recipe`): the (MoE layer, token) expert choices that differ from the fp32
reference's. `auto`'s twin takes the choices of its exported plan.

`int4keepproj/experts-int8` and `int4keepproj/experts-int4` are int4keepproj with the routed
experts at its int8 floor or at its 4-bit bulk whatever the family's `INT4_SAFE_EXPERTS` says
(the measurement that sets it); `int4keepproj` alone is the recipe as the family has it.

    flock /tmp/ssmport-heavy.lock nice -n 5 python benchmarks/trained_moe.py --budget 1.8MB \\
        --json benchmarks/results/trained_moe.json
    flock /tmp/ssmport-heavy.lock nice -n 5 python benchmarks/trained_moe.py \\
        --folder tests/data/qwen3_5_moe_pydoc --recipes int8keepproj int4keepproj/experts-int8 \\
        int4keepproj/experts-int4 --json benchmarks/results/trained_moe_qwen3_5_moe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from accumulation import compare, held_out_tokens, write_json  # noqa: E402
from int4_ablation import RoutingReplay, run_recipe, teacher_forced  # noqa: E402
from ssmport.exporter.pipeline import export  # noqa: E402
from ssmport.gate.torch_runner import TorchRunner  # noqa: E402
from ssmport.loader.resolve import load_model  # noqa: E402
from ssmport.quant import get_recipe  # noqa: E402
from ssmport.quant.recipes import STORAGE  # noqa: E402
from ssmport.runtime import Runner  # noqa: E402

FOLDER = HERE.parent / "tests" / "data" / "lfm2_moe_pydoc"
RECIPES = ("fp32", "int8keepproj", "int4keepproj", "int4", "auto")
EXPERTS_AT = {"experts-int8": False, "experts-int4": True}  # int4keepproj/<key>: Architecture.int4_safe_experts


@contextmanager
def experts_at(model, label: str):
    """The recipe a label names; for `recipe/experts-intN`, with the architecture's
    `int4_safe_experts` set as it says while the block runs."""
    name, _, experts = label.partition("/")
    if not experts:
        yield name
        return
    if experts not in EXPERTS_AT:
        raise SystemExit(f"unknown variant {label!r}: after '/' say one of {', '.join(EXPERTS_AT)}")
    arch, kept = model.architecture, model.architecture.int4_safe_experts
    arch.int4_safe_experts = EXPERTS_AT[experts]
    try:
        yield name
    finally:
        arch.int4_safe_experts = kept


def twin_recipe(name: str, manifest):
    """The recipe as the bundle applied it: auto with its plan's per-tensor choices."""
    recipe = get_recipe(name)
    if name != "auto":
        return recipe
    chosen = tuple((e["name"], e["dtype"]) for e in manifest.plan_tensors if e["dtype"] in STORAGE)
    return dataclasses.replace(recipe, per_tensor=chosen)


def measure(model, name: str, tokens, ref, scale: float, replay, budget: str) -> dict:
    """One recipe: its bundle (decode only, default gate) on the held-out tokens against the
    reference logits, and its torch twin's routing flips."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        bundle = export(model, out, quant=name, prefill_chunk=None, progress=False,
                        **({"size_budget": budget} if name == "auto" else {}))  # fmt: skip
        with Runner(bundle.path) as runner:
            got = compare(runner.step_each(tokens), ref)
        manifest = bundle.manifest
    replay.mode, replay.at, replay.changed, replay.calls = "count", 0, 0, 0
    run_recipe(model, twin_recipe(name, manifest), tokens)
    replay.mode = "off"
    gate = manifest.gate
    return got | {"max_rel_delta": got["max_abs_delta"] / scale, "asset_bytes": manifest.asset.bytes,
                  "plan_bytes": manifest.plan["summary"]["total"], "gate_passed": gate.passed,
                  "gate_max_rel": gate.max_rel_logit_delta, "gate_steps": gate.steps,
                  "gate_top1": f"{gate.top1_agree} + {gate.top1_excused_ties} ties, {gate.top1_mismatch} missed",
                  "routing_changed": replay.changed, "routing_choices": replay.calls,
                  "by_dtype": manifest.plan["summary"]["by_dtype"], "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", type=Path, default=FOLDER)
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), help="recipes, or int4keepproj/experts-int8|-int4")
    ap.add_argument("--budget", default="1.8MB", help="auto's --size-budget")
    ap.add_argument("--steps", type=int, default=241, help="teacher-forced held-out bytes")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)

    model = load_model(str(args.folder))
    tokens = held_out_tokens(model, args.steps)
    replay = RoutingReplay()
    try:
        replay.mode, replay.log = "record", []
        ref = teacher_forced(TorchRunner(model, "fp32"), tokens)
        replay.mode = "off"
        scale = max(1.0, float(np.abs(ref).max()))
        results = {"model": str(args.folder), "steps": len(tokens), "logit_scale": scale, "recipes": {}}
        print(f"{args.folder.name}: {len(tokens)} held-out bytes, logit scale {scale:.2f}, "
              f"{len(replay.log)} routing calls")  # fmt: skip
        for label in args.recipes:
            with experts_at(model, label) as name:
                r = results["recipes"][label] = measure(model, name, tokens, ref, scale, replay, args.budget)
            int8 = results["recipes"].get("int8keepproj")  # measure it first for the ratio
            if int8:
                r["x_int8keepproj"] = round(r["asset_bytes"] / int8["asset_bytes"], 3)
            print(f"  {label:26} asset {r['asset_bytes']:>10,} ({r.get('x_int8keepproj', '-')} x int8keepproj)  "
                  f"gate {'PASS' if r['gate_passed'] else 'FAIL'} {r['gate_max_rel']:.4f} ({r['gate_top1']})  "
                  f"held-out max|Δ|/scale {r['max_rel_delta']:.4f}  top-1 {r['top1_agree']}/{len(tokens)}  "
                  f"flips>0.5 {r['confident_flips']}/{r['confident_steps']}  "
                  f"routing {r['routing_changed']}/{r['routing_choices']}  {r['seconds']} s", flush=True)  # fmt: skip
    finally:
        replay.close()
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
