"""A tied embedding stored once (ssmport.quant.tied) against stored twice, on one checkpoint.

Writes a tied LFM2-shaped checkpoint with transformers (tests/hybrid_files.py, fixed seed),
exports it twice under --quant (the table read from the head's storage, and stored too), and
reports for each: plan bytes, asset bytes, runtime ops per decode call, and decode ms/token on
the Core AI runtime (median of --steps after --warmup, the two bundles' steps alternated), with
the two bundles' logits compared. A float head (fp32, fp16): the sharing switched off, the
logits must be equal (the same stored values, read two ways). An int8 head (int8keepproj,
int4keepproj, int8): --int8-tied-table on and off, whose rows differ (int8 levels for fp16
values): their max |Δ| is reported.

    python benchmarks/tied_table.py --vocab 65536 --hidden 512 --json out.json
    flock /tmp/ssmport-heavy.lock python benchmarks/tied_table.py --quant int4keepproj --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def export_bundle(folder: Path, out: Path, quant: str, share: bool):
    """`folder` exported under `quant` (no gate, decode only), the tied table read from the head or stored too."""
    import ssmport.exporter.convert as convert
    from ssmport.exporter.pipeline import export
    from ssmport.quant import get_recipe

    if get_recipe(quant).int8_head:
        return export(str(folder), str(out), quant=quant, gate=False, prefill_chunk=None, progress=False,
                      int8_tied_table=share)  # fmt: skip
    keep = convert.store_tied_table_once
    convert.store_tied_table_once = keep if share else (lambda lm, builder: False)
    try:
        return export(str(folder), str(out), quant=quant, gate=False, prefill_chunk=None, progress=False)
    finally:
        convert.store_tied_table_once = keep


def measure(results: list, steps: int, warmup: int) -> tuple[list[dict], list[np.ndarray]]:
    """Each bundle's facts and decode logits, the bundles' decode steps alternated (one warm-up
    and one timed step of each in turn), so a slower moment of the shared machine hits both."""
    from ssmport.bundle import Bundle
    from ssmport.runtime import Runner
    from ssmport.runtime.op_count import count_ops

    runners = [Runner(r.path) for r in results]
    tokens = [1 + (i * 7) % 50 for i in range(warmup + steps)]
    times: list[list[float]] = [[] for _ in results]
    logits: list[list[np.ndarray]] = [[] for _ in results]
    try:
        for i, t in enumerate(tokens):
            for runner, took, got in zip(runners, times, logits):
                start = time.perf_counter()
                got.append(runner.step(t))
                if i >= warmup:
                    took.append(1000 * (time.perf_counter() - start))
    finally:
        for runner in runners:
            runner.close()
    rows = []
    for r, took in zip(results, times):
        ops = count_ops(Bundle.open(r.path), prefill=False)["main"]
        rows.append({"plan_bytes": r.manifest.plan["summary"]["total"], "asset_bytes": r.manifest.asset.bytes,
                     "ops_per_decode_call": ops.ops, "by_type": ops.by_type,
                     "decode_ms": round(statistics.median(took), 2)})  # fmt: skip
    return rows, [np.stack(g) for g in logits]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=65536)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--quant", default="fp32")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    import hybrid_files as hf

    work = Path(tempfile.mkdtemp(prefix="tied-table-"))
    dims = replace(hf.Lfm2Dims(), vocab=a.vocab, hidden=a.hidden, ff_dim=2 * a.hidden)
    folder = hf.write_lfm2(work / "ckpt", dims, seed=3)
    results = [export_bundle(folder, work / ("shared" if share else "twice"), a.quant, share) for share in (True, False)]
    rows, logits = measure(results, a.steps, a.warmup)
    for share, row, r in zip((True, False), rows, results):
        (table,) = [e for e in r.manifest.plan["tensors"] if e["role"] == "embedding"]
        row.update({"shared": share, "table_dtype": table["dtype"]})
        print(json.dumps(row))
    delta = float(np.abs(logits[0] - logits[1]).max())
    scale = float(np.abs(logits[1]).max())
    print(f"logits max |Δ| between the two: {delta:.4g} (scale {scale:.4g}); equal: {delta == 0}")
    if a.json:
        a.json.write_text(json.dumps({"command": " ".join(sys.argv), "quant": a.quant, "vocab": a.vocab,
                                      "hidden": a.hidden, "rows": rows, "logits_max_delta": delta,
                                      "logits_scale": scale}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
