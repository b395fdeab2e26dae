"""RWKV-7 prefill: the 32-token pieces (the default, `ops.wkv7.SUB_CHUNK`) against the one-piece
64-token WY form, on the Core AI runtime. rwkv7-0.1b synthetic fp32, chunk 64: runtime ops per
call, and prefill speed and exactness against the M=1 loop (the two bundles alternated, twice).

    flock /tmp/ssmport-heavy.lock python benchmarks/rwkv7_pieces_ab.py \\
        --out benchmarks/results/rwkv7_prefill_pieces_ab.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

# benchmarks/ is on sys.path when run as a script
import prefill_speed

from ssmport.bundle import Bundle
from ssmport.exporter import export
from ssmport.ops import wkv7
from ssmport.runtime.op_count import count_ops
from ssmport.sources import load_model

FORMS = {"pieces of 32 (default)": 32, "one piece of 64": 64}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="rwkv7-0.1b")
    p.add_argument("--prompts", nargs="+", type=int, default=[64, 512])
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    work, default = Path(tempfile.mkdtemp(prefix="rwkv7-pieces-")), wkv7.SUB_CHUNK
    results = {}
    try:
        for form, sub in FORMS.items():
            wkv7.SUB_CHUNK = sub  # read when the prefill graph is traced
            try:
                path = export(load_model(a.model, synthetic=True), work / str(sub), quant="fp32", gate_steps=8,
                              prefill_chunk=64, progress=False, overwrite=True).path  # fmt: skip
            finally:
                wkv7.SUB_CHUNK = default
            ops = {f: c.ops for f, c in count_ops(Bundle.open(path)).items()}
            print(f"{form}: runtime ops per call {ops}", flush=True)
            results[form] = {"sub_chunk": sub, "path": path, "ops": ops, "runs": []}
        for _ in range(2):  # alternated, so background load hits both alike
            for form, r in results.items():
                print(form, flush=True)
                rows, share = prefill_speed.measure(r["path"], a.prompts, 2, seed=0)
                r["runs"].append({"prompts": rows, "recurrence": share})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for r in results.values():
        del r["path"]
    if a.out:
        a.out.write_text(json.dumps({"model": a.model, "forms": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
