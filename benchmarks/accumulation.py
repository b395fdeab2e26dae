"""Which part of a 16-bit bundle's error is the recipe, and which is this runtime's fp16 sums.

The Linux Core AI runtime accumulates fp16 matmuls in fp16; a GPU or ANE backend typically
keeps fp16 operands but sums in fp32. For each recipe this exports a decode-only bundle and
runs, teacher-forced on the same tokens:

  reference    the fp32 torch decode module (the gate's reference)
  torch32acc   the SAME stored weights the bundle holds (the recipe's WeightBuilder: fp16
               values, int8 blocks dequantized with their fp16 scales), every matmul fed
               fp16-rounded inputs and summed in fp32, logits rounded to the recipe's dtype
  coreai       the bundle on the Core AI runtime

and prints, against the reference: max and mean |Δlogits|, the logit std, top-1 agreement,
and top-1 flips where the reference's top-2 margin exceeds 0.5. `torch32acc` is what the
recipe costs; `coreai` minus that is this runtime's accumulation.

    python benchmarks/accumulation.py rwkv7-pydoc --steps 64         # trained, held-out text
    flock /tmp/ssmport-heavy.lock python benchmarks/accumulation.py rwkv7-0.1b --steps 16 \
        --json benchmarks/results/accumulation_rwkv7-0.1b.json       # 0.1B widths, synthetic
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
import torch

from ssmport.exporter.pipeline import export
from ssmport.loader.pretrained import BUNDLED
from ssmport.gate.accumulation import Fp32Accumulating, accumulate_in_fp32
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_model
from ssmport.tokenizers import load_tokenizer
from ssmport.gate.torch_runner import TorchRunner

CONFIDENT_MARGIN = 0.5


def held_out_tokens(model, steps: int) -> list[int]:
    """The shipped held-out text in the model's tokenizer (a trained model's own text; for
    synthetic weights any text will do)."""
    text = BUNDLED["rwkv7-pydoc"].validation_text.read_text(encoding="utf-8")
    ids = load_tokenizer(model.vocab_path).encode(text * 4)
    return ids[:steps]


def compare(got: np.ndarray, ref: np.ndarray) -> dict:
    top2 = np.sort(ref, axis=1)[:, -2:]
    confident = top2[:, 1] - top2[:, 0] > CONFIDENT_MARGIN
    agree = got.argmax(1) == ref.argmax(1)
    delta = np.abs(got.astype(np.float64) - ref)
    return {
        "max_abs_delta": float(delta.max()),
        "mean_abs_delta": float(delta.mean()),
        "top1_agree": int(agree.sum()),
        "confident_steps": int(confident.sum()),
        "confident_flips": int((confident & ~agree).sum()),
    }


def write_json(path: str, results: dict) -> None:
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="rwkv7-pydoc (trained) or a preset, exported with --synthetic weights")
    ap.add_argument("--recipes", nargs="+", default=["fp16", "int8keepproj"])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)

    model = load_model(args.model, synthetic=args.model not in BUNDLED)
    tokens = held_out_tokens(model, args.steps)
    reference = TorchRunner(model, "fp32")
    ref = reference.step_each(tokens).astype(np.float64)
    # The logit std over real tokens: rows a padded vocab never uses would inflate it.
    real = ref[:, : load_tokenizer(model.vocab_path).vocab_size] if model.vocab_path else ref
    results = {"model": args.model, "synthetic": model.synthetic, "steps": len(tokens),
               "logit_std": float(real.std()), "logit_scale": float(np.abs(ref).max()), "recipes": {}}  # fmt: skip
    print(f"{args.model}: {len(tokens)} teacher-forced tokens; reference logit std {results['logit_std']:.2f}, "
          f"max |logit| {results['logit_scale']:.2f}")  # fmt: skip
    for recipe in args.recipes:
        twin = TorchRunner(model, recipe)
        accumulate_in_fp32(twin.module)
        swapped = sum(isinstance(m, Fp32Accumulating) for m in twin.module.modules())
        started = time.perf_counter()
        torch32 = compare(twin.step_each(tokens), ref)
        with tempfile.TemporaryDirectory() as out:
            bundle = export(model, out, quant=recipe, gate=False, progress=False, prefill_chunk=None)
            with Runner(bundle.path) as runner:
                coreai = compare(runner.step_each(tokens), ref)
        results["recipes"][recipe] = {"torch32acc": torch32, "coreai": coreai, "matmuls_swapped": swapped,
                                      "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
        for label, r in (("torch fp32 sums", torch32), ("Core AI runtime", coreai)):
            print(f"  {recipe:13} {label:16} max |Δ| {r['max_abs_delta']:.4f}  mean |Δ| {r['mean_abs_delta']:.5f}  "
                  f"top-1 {r['top1_agree']}/{len(tokens)}  flips at margin > {CONFIDENT_MARGIN}: "
                  f"{r['confident_flips']}/{r['confident_steps']}", flush=True)  # fmt: skip
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
