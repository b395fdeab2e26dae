"""A tied embedding stored once (ssmport.quant.tied) against stored twice, on one checkpoint.

Writes a tied LFM2-shaped checkpoint with transformers (tests/hybrid_files.py, fixed seed),
exports it fp32 twice (the table read from the head's storage, and with the sharing switched
off), and reports for each: plan bytes, asset bytes, runtime ops per decode call, and decode
ms/token on the Core AI runtime (median of --steps after --warmup), with the two bundles'
logits compared (they must be equal: the same stored values, read two ways).

    python benchmarks/tied_table.py --vocab 65536 --hidden 512 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def measure(folder: Path, out: Path, share: bool, steps: int, warmup: int) -> tuple[dict, np.ndarray]:
    import ssmport.exporter.convert as convert
    from ssmport.bench import step_times_ms
    from ssmport.bundle import Bundle
    from ssmport.exporter.pipeline import export
    from ssmport.runtime import Runner
    from ssmport.runtime.op_count import count_ops

    keep = convert.store_tied_table_once
    convert.store_tied_table_once = keep if share else (lambda lm, builder: False)
    try:
        result = export(str(folder), str(out), quant="fp32", gate=False, prefill_chunk=None, progress=False)
    finally:
        convert.store_tied_table_once = keep
    ops = count_ops(Bundle.open(result.path), prefill=False)["main"]
    logits = []
    with Runner(result.path) as runner:
        tokens = [1 + (i * 7) % 50 for i in range(warmup + steps)]
        times = step_times_ms(lambda t: logits.append(runner.step(t)), runner.reset, tokens, warmup)
    return {"shared": share, "plan_bytes": result.manifest.plan["summary"]["total"],
            "asset_bytes": result.manifest.asset.bytes, "ops_per_decode_call": ops.ops,
            "decode_ms": round(statistics.median(times), 2)}, np.stack(logits)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=65536)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    import hybrid_files as hf

    work = Path(tempfile.mkdtemp(prefix="tied-table-"))
    dims = replace(hf.Lfm2Dims(), vocab=a.vocab, hidden=a.hidden, ff_dim=2 * a.hidden)
    folder = hf.write_lfm2(work / "ckpt", dims, seed=3)
    rows, logits = [], []
    for share in (True, False):
        row, got = measure(folder, work / ("shared" if share else "twice"), share, a.steps, a.warmup)
        rows.append(row)
        logits.append(got)
        print(json.dumps(row))
    same = bool(np.array_equal(logits[0], logits[1]))
    print(f"logits equal: {same}")
    if a.json:
        a.json.write_text(json.dumps({"command": " ".join(sys.argv), "vocab": a.vocab, "hidden": a.hidden,
                                      "rows": rows, "logits_equal": same}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
