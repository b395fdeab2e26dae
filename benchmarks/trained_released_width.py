"""A byte-level RWKV-7 trained at a released width, under one recipe: export, gate, held-out bytes.

The checkpoint is tools/train_tiny.py's (e.g. RWKV-7 0.1B's shape, L12 C768, on the Python docs
corpus); the tokenizer is the shipped rwkv7-pydoc `vocab.tsv` (256 bytes). On this runtime one
decode call of a 0.1B-wide 16-bit bundle takes seconds and the runtime is single-threaded, so a
recipe's work is split over processes, one core each (benchmarks/trained_released_width.sh):

  export    the bundle (decode-only by default, no gate) into --bundle, lowered once for this
            runtime so the processes after it load it from the cache; JSON: asset bytes, the
            plan by dtype (what `auto` chose), seconds
  gate      the CLI's export gate on that bundle (`--gate-steps` tokens of its built-in texts
            against the fp32 torch reference); JSON: verdict, max |Δ| / logit scale against the
            limit, top-1, seconds
  held-out  one of `--segments` consecutive segments of the first `--held-out-steps` bytes of
            the held-out text (the shipped rwkv7-pydoc `validation.txt`), teacher-forced from a
            zero state through the bundle and the fp32 torch reference; the logits go to an
            .npz after every byte, so a run stopped at the call's end keeps what it did
  merge     one JSON of every recipe: export, gate, and the held-out segments pooled (max
            |Δ| / scale, mean |Δ|, top-1 kept, flips where the reference's top-2 margin > 0.5
            (benchmarks/accumulation.py), nats per byte of the bundle and of the reference),
            also over the bytes every recipe reached, so recipes cut short compare fairly

    python benchmarks/trained_released_width.py export --weights run/rwkv7-pydoc.pth --recipe int8keepproj \\
        --bundle b/int8keepproj --json res/int8keepproj.export.json
    python benchmarks/trained_released_width.py gate --weights run/rwkv7-pydoc.pth --bundle b/int8keepproj \\
        --json res/int8keepproj.gate.json
    python benchmarks/trained_released_width.py held-out --weights run/rwkv7-pydoc.pth --bundle b/int8keepproj \\
        --segment 0 --segments 4 --npz res/int8keepproj.held0.npz
    python benchmarks/trained_released_width.py merge res --train-log run/train_log.jsonl \\
        --json benchmarks/results/trained_released_width_<model>.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from accumulation import compare, held_out_tokens, write_json  # noqa: E402
from ssmport.bundle import Bundle  # noqa: E402
from ssmport.exporter.options import EXPORT_GATE_STEPS  # noqa: E402
from ssmport.exporter.pipeline import EXPORT_GATE_PROMPTS, export  # noqa: E402
from ssmport.gate.run import gate_bundle  # noqa: E402
from ssmport.gate.torch_runner import TorchRunner  # noqa: E402
from ssmport.loader.pretrained import BUNDLED  # noqa: E402
from ssmport.loader.resolve import load_model  # noqa: E402
from ssmport.prefill import DEFAULT_CHUNK  # noqa: E402
from ssmport.runtime import Runner  # noqa: E402
from ssmport.runtime.lowering import ensure_lowered  # noqa: E402

BYTE_VOCAB = BUNDLED["rwkv7-pydoc"].checkpoint.parent / "vocab.tsv"
BUNDLE_NAME = "bundle"


def save_json(path: str | Path, results: dict) -> None:
    """Whole or not at all: `merge` may read it while this process still runs."""
    write_json(f"{path}.tmp", results)
    os.replace(f"{path}.tmp", path)


def load(args):
    torch.set_num_threads(1)  # one core per process: the processes share the machine
    return load_model(str(args.weights), vocab=str(args.vocab))


def run_export(args) -> None:
    started = time.perf_counter()
    model = load(args)
    budget = {"size_budget": args.budget} if args.recipe == "auto" else {}
    chunk = DEFAULT_CHUNK if args.prefill else None
    result = export(model, args.bundle, quant=args.recipe, prefill_chunk=chunk, gate=False, name=BUNDLE_NAME,
                    overwrite=True, progress=False, **budget)  # fmt: skip
    exported = time.perf_counter() - started
    ensure_lowered(Bundle.open(result.path))
    m = result.manifest
    row = {"recipe": args.recipe, "weights": str(args.weights), "config": model.config.describe(),
           "prefill_chunk": chunk, "size_budget": args.budget if budget else None, "asset_bytes": m.asset.bytes,
           "plan_bytes": m.plan["summary"]["total"], "by_dtype": m.plan["summary"]["by_dtype"],
           "export_seconds": round(exported, 1), "lowering_seconds": round(time.perf_counter() - started - exported, 1)}  # fmt: skip
    save_json(args.json, row)
    print(f"{args.recipe}: asset {row['asset_bytes']:,} B, export {row['export_seconds']} s, "
          f"lowering {row['lowering_seconds']} s", flush=True)  # fmt: skip


def run_gate(args) -> None:
    started = time.perf_counter()
    model = load(args)
    bundle = Bundle.open(Path(args.bundle) / BUNDLE_NAME)
    # record=False: the held-out processes read this bundle's manifest meanwhile
    report = gate_bundle(bundle, model, prompts=EXPORT_GATE_PROMPTS, steps=args.gate_steps, record=False)
    s = report.summary()
    row = {"gate_passed": s["passed"], "gate_max_rel": s["max_rel_logit_delta"],
           "gate_limit": s["thresholds"]["max_rel_logit_delta"], "gate_min_top1": s["thresholds"]["min_top1"],
           "gate_top1_agree": s["top1_agree"], "gate_excused_ties": s["top1_excused_ties"],
           "gate_missed": s["top1_mismatch"], "gate_steps": s["steps"] * s["prompts"],
           "gate_seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    save_json(args.json, row)
    print(f"{bundle.manifest.recipe.name}: gate {'PASS' if row['gate_passed'] else 'FAIL'} {row['gate_max_rel']:.4f} "
          f"of scale (limit {row['gate_limit']}), top-1 {row['gate_top1_agree']}/{row['gate_steps']}, "
          f"{row['gate_seconds']} s", flush=True)  # fmt: skip


def segment_bounds(segment: int, segments: int, steps: int) -> tuple[int, int]:
    """Positions [start, end) of `segment` when `steps` bytes are cut into `segments` runs."""
    return segment * steps // segments, (segment + 1) * steps // segments


def run_held_out(args) -> None:
    model = load(args)
    start, end = segment_bounds(args.segment, args.segments, args.held_out_steps)
    tokens = held_out_tokens(model, end + 1)  # one more: the target of the segment's last byte
    inputs, targets = tokens[start:end], np.array(tokens[start + 1 : end + 1])
    reference = TorchRunner(model, "fp32").step_each(inputs)  # from a zero state, as the bundle
    rows = []
    begun = time.perf_counter()
    with Runner(Path(args.bundle) / BUNDLE_NAME) as runner:
        for token in inputs:
            rows.append(runner.step(token))
            n = len(rows)
            tmp = f"{args.npz}.tmp.npz"
            np.savez(tmp, got=np.stack(rows), reference=reference[:n], targets=targets[:n], start=start,
                     seconds=time.perf_counter() - begun)  # fmt: skip
            os.replace(tmp, args.npz)
    print(f"segment {args.segment} (bytes {start}-{end}): {len(rows)} steps in {time.perf_counter() - begun:.1f} s",
          flush=True)  # fmt: skip


def nats_per_byte(logits: np.ndarray, targets: np.ndarray) -> float:
    """Mean cross-entropy of the next byte (log-softmax over every row of the vocabulary)."""
    x = logits.astype(np.float64)
    top = x.max(1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(x - top).sum(1))
    return float((log_z - x[np.arange(len(targets)), targets]).mean())


def pooled(segments: list[dict], steps: list[int] | None = None) -> dict:
    """One recipe's held-out figures over its segments (the first `steps[i]` bytes of segment i)."""
    cut = [s if steps is None else {k: s[k][: steps[i]] for k in ("got", "reference", "targets")}
           for i, s in enumerate(segments)]  # fmt: skip
    got, ref = (np.concatenate([s[k] for s in cut]) for k in ("got", "reference"))
    targets = np.concatenate([s["targets"] for s in cut])
    if not len(targets):
        return {"steps": 0}
    ref = ref.astype(np.float64)
    scale = max(1.0, float(np.abs(ref).max()))
    figures = compare(got, ref)
    return figures | {"steps": len(targets), "logit_scale": scale, "max_rel_delta": figures["max_abs_delta"] / scale,
                      "nats_per_byte": nats_per_byte(got, targets), "fp32_nats_per_byte": nats_per_byte(ref, targets)}  # fmt: skip


def read_segments(folder: Path, recipe: str) -> list[dict]:
    segments = []
    for path in sorted(folder.glob(f"{recipe}.held*.npz"), key=lambda p: int(p.stem.split("held")[1])):
        with np.load(path) as z:
            segments.append({k: z[k] for k in ("got", "reference", "targets")} | {"start": int(z["start"]),
                                                                                  "seconds": float(z["seconds"])})
    return segments


def merge(args) -> None:
    """One JSON of a width's recipes; a recipe whose processes did not finish keeps what they wrote."""
    folder = Path(args.folder)
    recipes = {}
    for path in sorted(folder.glob("*.export.json")):
        recipe = path.name.removesuffix(".export.json")
        row = json.loads(path.read_text())
        gate = folder / f"{recipe}.gate.json"
        row |= json.loads(gate.read_text()) if gate.exists() else {"gate": "did not finish"}
        recipes[recipe] = row
    for log in sorted(folder.glob("*.log")):  # a chain whose export failed or did not finish
        lines = log.read_text().strip().splitlines()
        if log.stem not in recipes:
            recipes[log.stem] = {"recipe": log.stem, "export": "failed or did not finish",
                                 "last_log_line": lines[-1] if lines else ""}  # fmt: skip
    segments = {r: read_segments(folder, r) for r in recipes}
    for recipe, segs in segments.items():
        if segs:
            recipes[recipe]["held_out"] = pooled(segs) | {
                "segments": [{"start": s["start"], "steps": len(s["targets"]), "seconds": round(s["seconds"], 1)}
                             for s in segs]}  # fmt: skip
    # The bytes every recipe reached: each segment cut to the fewest steps any recipe did there.
    counts = [[len(s["targets"]) for s in segs] for segs in segments.values() if segs]
    if counts and len({len(c) for c in counts}) == 1:
        common = [min(c[i] for c in counts) for i in range(len(counts[0]))]
        for recipe, segs in segments.items():
            if segs:
                recipes[recipe]["held_out_common"] = pooled(segs, common)
    results = {"recipes": recipes}
    if args.train_log:
        entries = [json.loads(line) for line in Path(args.train_log).read_text().splitlines()]
        start, end = entries[0], entries[-1]
        results["training"] = {k: start.get(k) for k in ("dims", "parameters", "hardware", "unigram_val_loss", "settings")}
        results["training"] |= {k: end.get(k) for k in ("steps", "stopped_early", "val_loss", "train_seconds", "peak_memory_gb")}
    write_json(args.json, results)
    for recipe, row in recipes.items():
        h = row.get("held_out_common") or row.get("held_out") or {}
        print(f"{recipe}: gate {row.get('gate_max_rel', 'unfinished')}, held-out {h.get('steps', 0)} bytes"
              + (f", top-1 {h['top1_agree']}, flips {h['confident_flips']}/{h['confident_steps']}, "
                 f"{h['nats_per_byte']:.4f} vs fp32 {h['fp32_nats_per_byte']:.4f} nats/byte" if h.get("steps") else ""))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--weights", type=Path, required=True, help="tools/train_tiny.py's .pth")
    common.add_argument("--vocab", type=Path, default=BYTE_VOCAB)
    common.add_argument("--bundle", required=True, help="the folder the export writes its bundle into")
    e = sub.add_parser("export", parents=[common], help="the bundle, no gate, lowered once")
    e.add_argument("--recipe", required=True)
    e.add_argument("--budget", help="auto's --size-budget")
    e.add_argument("--prefill", action="store_true", help="with the CLI's default prefill function (default: decode-only)")
    e.add_argument("--json", required=True)
    g = sub.add_parser("gate", parents=[common], help="the export gate on the exported bundle")
    g.add_argument("--gate-steps", type=int, default=EXPORT_GATE_STEPS)
    g.add_argument("--json", required=True)
    h = sub.add_parser("held-out", parents=[common], help="one segment of the held-out bytes, teacher-forced")
    h.add_argument("--held-out-steps", type=int, default=241, help="held-out bytes cut into the segments")
    h.add_argument("--segments", type=int, default=1)
    h.add_argument("--segment", type=int, default=0)
    h.add_argument("--npz", required=True)
    m = sub.add_parser("merge", help="gather a width's files (RECIPE.export.json, .gate.json, .heldK.npz)")
    m.add_argument("folder")
    m.add_argument("--train-log", help="tools/train_tiny.py's train_log.jsonl")
    m.add_argument("--json", required=True)
    args = ap.parse_args()
    {"export": run_export, "gate": run_gate, "held-out": run_held_out, "merge": merge}[args.mode](args)


if __name__ == "__main__":
    main()
