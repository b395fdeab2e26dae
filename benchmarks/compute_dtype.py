"""fp16 vs fp32 compute under integer weights: what each costs here, and how far each is from fp32.

For each variant (a recipe with its `compute_dtype` set) this exports a decode-only bundle of
MODEL (synthetic weights at the preset's released shapes) and reports: the runtime ops per
decode call, the median ms per decode step on this Core AI runtime, and the asset size; then,
on the trained rwkv7-pydoc (held-out text, teacher-forced, Core AI runtime), the error against
the fp32 torch reference. With --full, it also times the whole default export (gate and
prefill included) of MODEL per variant, as `ssmport export MODEL --synthetic --quant R` runs it.

    flock /tmp/ssmport-heavy.lock python benchmarks/compute_dtype.py rwkv7-0.1b --full \
        --json benchmarks/results/compute_dtype_rwkv7-0.1b.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time

import numpy as np
import torch

from accumulation import write_json, compare, held_out_tokens
from ssmport.exporter.pipeline import export
from ssmport.quant import RECIPES
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_model
from ssmport.gate.torch_runner import TorchRunner

# variant name: (recipe, compute dtype); "fp16" is what the integer blocks dequantize to
VARIANTS = {
    "fp32": ("fp32", None),
    "int8keepproj fp16 compute": ("int8keepproj", torch.float16),
    "int8keepproj fp32 compute": ("int8keepproj", torch.float32),
    "int4keepproj fp16 compute": ("int4keepproj", torch.float16),
    "int4keepproj fp32 compute": ("int4keepproj", torch.float32),
}


def register(variant: str) -> str:
    """The variant as a recipe the exporter and the gate can look up by name (this process only)."""
    base, compute = VARIANTS[variant]
    if compute is None:
        return base
    name = f"{base}-{str(compute).removeprefix('torch.float')}c"
    RECIPES[name] = dataclasses.replace(RECIPES[base], name=name, compute_dtype=compute)
    return name


def ops_per_call(bundle_path) -> int:
    from coreai.authoring import AIModelAsset

    summary = AIModelAsset.load(bundle_path / "model.aimodel").summary(include_statistics=True)
    return int(sum(dict(summary.operation_distribution).values()))


def decode_ms(bundle_path, steps: int) -> float:
    with Runner(bundle_path) as runner:
        times = []
        for t in range(steps + 1):
            started = time.perf_counter()
            runner.step(1 + t)
            times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times[1:])  # the first call loads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a preset, exported with --synthetic weights")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=4, help="decode steps timed per variant")
    ap.add_argument("--error-steps", type=int, default=64, help="rwkv7-pydoc held-out tokens per variant")
    ap.add_argument("--full", action="store_true", help="also time the default export (gate and prefill)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    model = load_model(args.model, synthetic=True)
    trained = load_model("rwkv7-pydoc")
    tokens = held_out_tokens(trained, args.error_steps)
    ref = TorchRunner(trained, "fp32").step_each(tokens).astype(np.float64)
    results = {"model": args.model, "decode_steps": args.steps, "error_steps": len(tokens), "variants": {}}
    for variant in args.variants:
        recipe = register(variant)
        row = {}
        with tempfile.TemporaryDirectory() as out:
            started = time.perf_counter()
            bundle = export(model, out, quant=recipe, gate=False, progress=False, prefill_chunk=None)
            row["export_s_no_gate"] = round(time.perf_counter() - started, 1)
            row["asset_bytes"] = bundle.manifest.asset.bytes
            row["ops_per_call"] = ops_per_call(bundle.path)
            row["decode_ms"] = round(decode_ms(bundle.path, args.steps), 1)
            small = export(trained, out, quant=recipe, gate=False, progress=False, prefill_chunk=None)
            with Runner(small.path) as runner:
                row["pydoc_error"] = compare(runner.step_each(tokens), ref)
            if args.full:
                started = time.perf_counter()
                full = export(model, out, quant=recipe, progress=False, overwrite=True)
                row["export_s_default"] = round(time.perf_counter() - started, 1)
                row["gate"] = {"passed": full.manifest.gate.passed, "max_rel": full.manifest.gate.max_rel_logit_delta}
        results["variants"][variant] = row
        e = row["pydoc_error"]
        print(f"{variant:28} ops/call {row['ops_per_call']:>5}  decode {row['decode_ms']:>8.1f} ms  asset "
              f"{row['asset_bytes']:>12,}  pydoc max|Δ| {e['max_abs_delta']:.4f} mean {e['mean_abs_delta']:.5f} "
              f"flips {e['confident_flips']}/{e['confident_steps']}"
              + (f"  default export {row['export_s_default']} s gate {row['gate']}" if args.full else ""), flush=True)  # fmt: skip
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
