"""What reading a tied embedding from the int8 LM head costs in precision, on trained tied models.

With an int8 head (int8keepproj, int4keepproj), `ssmport.quant.tied` can make the embedding
read the head's int8 levels and scales instead of an fp16 table of its own. That stores the
matrix once but changes the embedding's values (int8 blocks of 32 for fp16). For each trained
tied folder (tests/data/*_moe_pydoc: transformers' own classes trained on the pydoc bytes) and
recipe, this exports a decode-only bundle twice, the table read from the head and kept fp16,
each with its export gate (default stream: 8 steps on the Core AI runtime), and runs both
teacher-forced on the held-out text (rwkv7-pydoc's validation.txt, which none of the models
saw) against the fp32 torch reference: asset bytes, gate verdict and max |Δ| / logit scale,
held-out max and mean |Δ| / scale, top-1 agreement, flips where the reference's top-2 margin
> 0.5, and the two bundles' distance from each other.

    flock /tmp/ssmport-heavy.lock nice -n 5 python benchmarks/tied_int8_fidelity.py \\
        --json benchmarks/results/tied_int8_fidelity.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from accumulation import compare, held_out_tokens, write_json  # noqa: E402
from ssmport.exporter.pipeline import export  # noqa: E402
from ssmport.gate.torch_runner import TorchRunner  # noqa: E402
from ssmport.loader.resolve import load_model  # noqa: E402
from ssmport.runtime import Runner  # noqa: E402

DATA = HERE.parent / "tests" / "data"
FOLDERS = ("lfm2_moe_pydoc", "qwen3_5_moe_pydoc", "granitemoehybrid_moe_pydoc")  # the tied trained ones
RECIPES = ("int8keepproj", "int4keepproj")


def bundle_logits(model, recipe: str, int8_table: bool, tokens: list[int]) -> tuple[np.ndarray, dict]:
    """The bundle's held-out logits (the table read from the int8 head or kept fp16) and its facts."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        bundle = export(model, out, quant=recipe, prefill_chunk=None, progress=False, int8_tied_table=int8_table)
        with Runner(bundle.path) as runner:
            got = runner.step_each(tokens).astype(np.float64)
        m = bundle.manifest
    (table,) = [e for e in m.plan_tensors if e["role"] == "embedding"]
    return got, {"asset_bytes": m.asset.bytes, "plan_bytes": m.plan["summary"]["total"], "table_dtype": table["dtype"],
                 "table_shares": table.get("shares"), "gate_passed": m.gate.passed,
                 "gate_max_rel": m.gate.max_rel_logit_delta,
                 "gate_top1": f"{m.gate.top1_agree} + {m.gate.top1_excused_ties} ties, {m.gate.top1_mismatch} missed",
                 "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folders", nargs="+", default=list(FOLDERS), help="under tests/data, or paths")
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES))
    ap.add_argument("--steps", type=int, default=241, help="teacher-forced held-out bytes")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    results = {"command": " ".join(sys.argv), "steps": args.steps, "models": {}}
    for name in args.folders:
        folder = DATA / name if (DATA / name).is_dir() else Path(name)
        model = load_model(str(folder))
        tokens = held_out_tokens(model, args.steps)
        ref = TorchRunner(model, "fp32").step_each(tokens).astype(np.float64)
        scale = max(1.0, float(np.abs(ref).max()))
        rows = results["models"][folder.name] = {"logit_scale": scale, "recipes": {}}
        print(f"{folder.name}: {len(tokens)} held-out bytes, logit scale {scale:.2f}", flush=True)
        for recipe in args.recipes:
            got = {}
            for int8_table in (True, False):
                label = "table from int8 head" if int8_table else "fp16 table"
                logits, facts = bundle_logits(model, recipe, int8_table, tokens)
                got[int8_table] = logits
                r = compare(logits, ref) | facts
                r["max_rel_delta"], r["mean_rel_delta"] = r["max_abs_delta"] / scale, r["mean_abs_delta"] / scale
                rows["recipes"].setdefault(recipe, {})[label] = r
                print(f"  {recipe:13} {label:21} asset {r['asset_bytes']:>9,} table {r['table_dtype']:7} "
                      f"gate {'PASS' if r['gate_passed'] else 'FAIL'} {r['gate_max_rel']:.4f} ({r['gate_top1']})  "
                      f"held-out max|Δ|/scale {r['max_rel_delta']:.4f} mean {r['mean_rel_delta']:.5f}  "
                      f"top-1 {r['top1_agree']}/{len(tokens)}  flips>0.5 {r['confident_flips']}/{r['confident_steps']}  "
                      f"{r['seconds']} s", flush=True)  # fmt: skip
            between = np.abs(got[True] - got[False])
            rows["recipes"][recipe]["between"] = {"max_rel": float(between.max()) / scale,
                                                  "mean_rel": float(between.mean()) / scale}  # fmt: skip
            print(f"  {recipe:13} the two bundles apart: max {between.max() / scale:.4f} mean {between.mean() / scale:.5f}"
                  " of scale", flush=True)  # fmt: skip
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
