"""A byte-level RWKV-7 trained at a released width, under one recipe: export, gate, held-out bytes.

The checkpoint is tools/train_tiny.py's (e.g. RWKV-7 0.1B's shape, L12 C768, on the Python docs
corpus); the tokenizer is the shipped rwkv7-pydoc `vocab.tsv` (256 bytes). One process runs one
recipe, so recipes run side by side on as many cores (the Core AI runtime is single-threaded):

1. export a bundle (decode-only, or with `--prefill` the CLI's default prefill function) with
   the export's own gate (the CLI's gate: `--gate-steps`
   tokens of its built-in texts, fp32 torch reference) and write the JSON at once: asset bytes,
   plan by dtype (what `auto` chose), gate verdict, max |Δ| / logit scale against the limit;
2. run the bundle teacher-forced on held-out text (the shipped rwkv7-pydoc `validation.txt`, a
   file of the held-out split) against the fp32 torch reference, token by token until
   `--held-out-steps` or `--held-out-seconds`, and write the JSON again: max |Δ| / scale,
   top-1 agreement, flips where the reference's top-2 margin > 0.5 (benchmarks/accumulation.py).

    python benchmarks/trained_released_width.py run --weights run/rwkv7-pydoc.pth --recipe int8keepproj \\
        --json int8keepproj.json
    python benchmarks/trained_released_width.py merge fp16.json int8keepproj.json ... \\
        --train-log run/train_log.jsonl --json benchmarks/results/trained_released_width_<model>.json
"""

from __future__ import annotations

import argparse
import json
import os
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
from ssmport.loader.pretrained import BUNDLED  # noqa: E402
from ssmport.loader.resolve import load_model  # noqa: E402
from ssmport.prefill import DEFAULT_CHUNK  # noqa: E402
from ssmport.quant import get_recipe  # noqa: E402
from ssmport.quant.recipes import gate_thresholds  # noqa: E402
from ssmport.runtime import Runner  # noqa: E402

BYTE_VOCAB = BUNDLED["rwkv7-pydoc"].checkpoint.parent / "vocab.tsv"


def gate_row(manifest) -> dict:
    g = manifest.gate
    limit = gate_thresholds(get_recipe(manifest.recipe.name), manifest.recipe.state_dtype,
                            manifest.main.outputs[0].dtype)  # fmt: skip
    return {"gate_passed": g.passed, "gate_max_rel": g.max_rel_logit_delta, "gate_limit": limit.max_rel_logit_delta,
            "gate_min_top1": limit.min_top1, "gate_top1_agree": g.top1_agree, "gate_excused_ties": g.top1_excused_ties,
            "gate_missed": g.top1_mismatch, "gate_steps": g.steps * g.prompts, "asset_bytes": manifest.asset.bytes,
            "plan_bytes": manifest.plan["summary"]["total"],
            "by_dtype": manifest.plan["summary"]["by_dtype"]}  # fmt: skip


def held_out(runner, reference: np.ndarray, tokens: list[int], deadline: float) -> dict:
    """The bundle teacher-forced on `tokens` until done or `deadline` (perf_counter seconds)."""
    rows = []
    for token in tokens:
        if time.perf_counter() > deadline:
            break
        rows.append(runner.step(token))
    n = len(rows)
    scale = max(1.0, float(np.abs(reference[:n]).max())) if n else 1.0
    got = compare(np.stack(rows), reference[:n]) if n else {}
    return got | {"steps": n, "logit_scale": scale, "max_rel_delta": got.get("max_abs_delta", 0.0) / scale}


def save(path: str, results: dict) -> None:
    """Whole or not at all: `merge` may read it while this process still runs."""
    write_json(f"{path}.tmp", results)
    os.replace(f"{path}.tmp", path)


def run(args) -> None:
    torch.set_num_threads(1)
    started = time.perf_counter()
    model = load_model(str(args.weights), vocab=str(args.vocab))
    chunk = DEFAULT_CHUNK if args.prefill else None
    results = {"label": args.label or args.recipe, "weights": str(args.weights), "recipe": args.recipe,
               "config": model.config.describe(), "prefill_chunk": chunk}  # fmt: skip
    budget = {"size_budget": args.budget} if args.recipe == "auto" else {}
    with tempfile.TemporaryDirectory() as out:
        bundle = export(model, out, quant=args.recipe, prefill_chunk=chunk, gate_steps=args.gate_steps,
                        progress=False, **budget)  # fmt: skip
        results |= gate_row(bundle.manifest) | {"size_budget": args.budget if budget else None,
                                                "export_gate_seconds": round(time.perf_counter() - started, 1)}
        save(args.json, results)
        print(f"{results['label']}: asset {results['asset_bytes']:,} B, gate {'PASS' if results['gate_passed'] else 'FAIL'} "
              f"{results['gate_max_rel']:.4f} of scale (limit {results['gate_limit']}), "
              f"{results['export_gate_seconds']} s", flush=True)  # fmt: skip
        if not args.held_out_steps:
            return
        tokens = held_out_tokens(model, args.held_out_steps)
        reference = TorchRunner(model, "fp32").step_each(tokens).astype(np.float64)
        start = time.perf_counter()
        with Runner(bundle.path) as runner:
            results["held_out"] = held_out(runner, reference, tokens, start + args.held_out_seconds)
        results["held_out"]["seconds"] = round(time.perf_counter() - start, 1)
    save(args.json, results)
    h = results["held_out"]
    print(f"{results['label']}: held-out {h['steps']} bytes, max|Δ|/scale {h['max_rel_delta']:.4f}, "
          f"top-1 {h['top1_agree']}/{h['steps']}, flips>0.5 {h['confident_flips']}/{h['confident_steps']}, "
          f"{h['seconds']} s", flush=True)  # fmt: skip


def merge(args) -> None:
    """One JSON of every recipe's file (a recipe whose process did not finish keeps what it wrote)."""
    recipes = {}
    for path in args.files:
        row = json.loads(Path(path).read_text())
        recipes[row.pop("label")] = row
    results = {"recipes": recipes}
    if args.train_log:
        entries = [json.loads(line) for line in Path(args.train_log).read_text().splitlines()]
        start, end = entries[0], entries[-1]
        results["training"] = {k: start.get(k) for k in ("dims", "parameters", "hardware", "unigram_val_loss", "settings")}
        results["training"] |= {k: end.get(k) for k in ("steps", "stopped_early", "val_loss", "train_seconds", "peak_memory_gb")}
    write_json(args.json, results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run", help="export + gate + held-out bytes under one recipe")
    r.add_argument("--weights", type=Path, required=True, help="tools/train_tiny.py's .pth")
    r.add_argument("--vocab", type=Path, default=BYTE_VOCAB)
    r.add_argument("--recipe", required=True)
    r.add_argument("--budget", help="auto's --size-budget")
    r.add_argument("--prefill", action="store_true", help="with the CLI's default prefill function (its gate "
                   "checks it too); default: decode-only")
    r.add_argument("--label", help="the recipe's key in the merged JSON (default: the recipe)")
    r.add_argument("--gate-steps", type=int, default=8)
    r.add_argument("--held-out-steps", type=int, default=241, help="teacher-forced held-out bytes (0: none)")
    r.add_argument("--held-out-seconds", type=float, default=300, help="stop the held-out run after this")
    r.add_argument("--json", required=True)
    m = sub.add_parser("merge", help="gather the recipes' JSON files")
    m.add_argument("files", nargs="*")
    m.add_argument("--train-log", help="tools/train_tiny.py's train_log.jsonl")
    m.add_argument("--json", required=True)
    args = ap.parse_args()
    (run if args.mode == "run" else merge)(args)


if __name__ == "__main__":
    main()
