"""The fp32 gate's three distances at a preset's width and a chosen depth: the Core AI bundle vs
the fp32 export-form module (what the gate compared before), the fp32 module vs the same module
in float64 (its noise floor), and the bundle vs fp64 (what the gate judges now), with their
ratio: how much further from exact math this runtime's fp32 is than torch's on the same weights
(what `ssmport.quant.recipes.FP32_FLOOR_FACTOR` is derived from). Also the two references' times.

    python benchmarks/fp32_gate_floor.py rwkv7-tiny
    flock /tmp/ssmport-heavy.lock nice -n 5 python benchmarks/fp32_gate_floor.py rwkv6-1.6b --layers 4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import tempfile
import time

from ssmport.bundle import Bundle
from ssmport.exporter.pipeline import export
from ssmport.gate.run import gate_bundle
from ssmport.loader.resolve import DEFAULT_SEED, load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("preset")
    ap.add_argument("--layers", type=int, help="the preset's width at this depth (default: its own)")
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8, help="tokens per stream (the export gate's default: 8)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    model = load_model(args.preset, synthetic=True, seed=DEFAULT_SEED)
    if args.layers:
        cfg = dataclasses.replace(model.config, num_layers=args.layers)
        model = dataclasses.replace(model, config=cfg, weights=model.architecture.synthetic_weights(cfg, DEFAULT_SEED))
    with tempfile.TemporaryDirectory(prefix="ssmport-floor-") as out:
        start = time.perf_counter()
        bundle = Bundle.open(export(model, out, quant="fp32", gate=False, progress=False).path)
        export_s = time.perf_counter() - start
        report = gate_bundle(bundle, model, prompts=args.prompts, steps=args.steps, record=False)
    f = report.noise_floor()
    figures = {
        "preset": args.preset, "layers": model.config.num_layers, "tokens": report.n, "logit_scale": report.logit_scale,
        **f, "runtime_over_torch": f["bundle_vs_fp64_abs"] / f["reference_vs_fp64_abs"],
        "export_s": export_s, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "headline": report.headline(),
    }  # fmt: skip
    print(report.headline())
    print(f"{args.preset} L{figures['layers']}, {report.n} steps: bundle vs fp32 reference "
          f"{f['bundle_vs_reference_rel']:.2e}, fp32 reference vs fp64 {f['reference_vs_fp64_rel']:.2e}, bundle vs "
          f"fp64 {f['bundle_vs_fp64_rel']:.2e} of scale {report.logit_scale:.3g}; runtime / torch "
          f"{figures['runtime_over_torch']:.2f}; references fp32 {f['fp32_reference_s']:.1f} s, fp64 "
          f"{f['fp64_reference_s']:.1f} s; export {export_s:.0f} s, peak RSS {figures['peak_rss_mb']:.0f} MB")  # fmt: skip
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)


if __name__ == "__main__":
    main()
