"""Decode cost at a given history length, bundle by bundle: does it follow the tokens held or
the context allocated? (issue 32, part 0)

    python benchmarks/context_cost.py out/lfm2-c512 out/lfm2-c4096 --held 100 --steps 16
    python benchmarks/context_cost.py --export granite-4.0-h-350m --work /tmp/ctx   # exports, then measures
    python benchmarks/context_cost.py --export recurrentgemma-2b:3 --set vocab_size=4096 --layouts ssmport \
        --contexts 4096 --work /tmp/ring                                  # a ring of W = 2048 (sliding window)

For each bundle: feed `--held` tokens (through prefill when the bundle has it), then time
`--steps` decode calls (median ms/token; the history grows from held to held+steps), count
the runtime ops of one decode call at that length (a separate profiled load), and report the
KV positions a call reads (a growing cache's allocation, else the context) and their bytes, and
the ring slots a call reads (a growing ring's allocation, else the window) and their bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time

import numpy as np

from ssmport.bundle import Bundle
from ssmport.runtime import Runner
from ssmport.runtime.op_count import OpLog, summarize


def measure(path: str, held: int, steps: int, warmup: int = 3) -> dict:
    bundle = Bundle.open(path)
    m = bundle.manifest
    rng = np.random.default_rng(0)
    prompt = rng.integers(1, m.vocab_size, held).tolist()
    then = rng.integers(1, m.vocab_size, warmup + steps).tolist()
    with Runner(bundle) as runner:
        runner.feed(prompt)  # a first call of each function pays one-time setup: warm both up
        runner.reset()
        runner.feed(prompt)
        for t in then[:warmup]:
            runner.step(t)
        times = []
        for t in then[warmup:]:
            start = time.perf_counter()
            runner.step(t)
            times.append(1000 * (time.perf_counter() - start))
        positions = runner.kv_positions or m.context
        slots = getattr(runner, "ring_slots", None) or max((s.window for s in m.ring_states), default=0)
    log = OpLog()
    with Runner(bundle, profiler=log.profiler()) as runner:
        runner.feed(prompt)
        runner.step(then[0])
        ops = summarize(log.calls[-1])
    return {"bundle": path, "layout": m.layout, "context": m.context, "held": held,
            "decode_ms_per_token": float(np.median(times)), "decode_ms_min": float(np.min(times)),
            "ops_per_decode_call": ops.ops, "kv_positions_read": positions,
            "kv_bytes_read_per_token": m.kv_bytes_per_token * (positions or 0), "ring_slots_read": slots,
            # per slot, computed here (not Manifest.ring_bytes_per_slot): a tree before it is measured too
            "ring_bytes_read_per_token": sum(math.prod(s.full_shape) // s.window * slots * np.dtype(s.dtype).itemsize
                                             for s in m.ring_states)}  # fmt: skip


def export_variants(spec: str, work: str, contexts: list[int], layouts: list[str], overrides: list[str]) -> list[str]:
    """A preset's synthetic fp32 decode-only bundles (PRESET:N: its first N layers; `overrides`:
    KEY=INT config fields replaced, e.g. a smaller vocabulary), one per (layout, context); no
    gate (the parity tests cover these graphs)."""
    from hybrid_speed import DEFAULT_SEED, synthetic_model

    from ssmport.architectures import LoadedModel, get_architecture, presets
    from ssmport.exporter.pipeline import export


    if overrides:  # the config first, the weights once (a released preset's whole synthetic model is ~11 GB)
        preset, _, layers = spec.partition(":")
        known = presets()[preset]
        arch = get_architecture(known.architecture)
        config = dataclasses.replace(arch.config_from_json(dict(known.config)),
                                     **{k: int(v) for k, v in (o.split("=", 1) for o in overrides)})  # fmt: skip
        if layers:
            field = "pattern" if hasattr(config, "pattern") else "layer_types"
            config = dataclasses.replace(config, **{field: getattr(config, field)[: int(layers)]})
        model = LoadedModel(arch, config, arch.synthetic_weights(config, DEFAULT_SEED),
                            {"kind": "synthetic", "preset": preset, "seed": DEFAULT_SEED, "overrides": overrides},
                            name=preset)  # fmt: skip
    else:
        model = synthetic_model(spec)
    return [str(export(model, work, quant="fp32", gate=False, progress=False, prefill_chunk=None, layout=layout,
                       context=context, name=f"{spec.replace(':', '-')}-{layout}-c{context}", overwrite=True).path)
            for layout in layouts for context in contexts]  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundles", nargs="*")
    p.add_argument("--export", metavar="PRESET[:N]", help="export the variants first (synthetic fp32)")
    p.add_argument("--work", default="out", help="where --export writes its bundles")
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096])
    p.add_argument("--layouts", nargs="+", default=["ssmport", "apple"])
    p.add_argument("--set", action="append", default=[], metavar="KEY=INT", help="a config field for --export")
    p.add_argument("--held", type=int, default=100)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    bundles = a.bundles + (export_variants(a.export, a.work, a.contexts, a.layouts, a.set) if a.export else [])
    rows = [measure(b, a.held, a.steps) for b in bundles]
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(f"{r['bundle']:40} {r['layout']:8} context {r['context']!s:5}  {r['decode_ms_per_token']:8.1f} ms/token "
              f"(min {r['decode_ms_min']:.1f})  {r['ops_per_decode_call']:5} ops  KV read {r['kv_positions_read']} "
              f"positions, {r['kv_bytes_read_per_token'] / 1e6:.2f} MB  ring read {r['ring_slots_read']} slots, "
              f"{r['ring_bytes_read_per_token'] / 1e6:.2f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
