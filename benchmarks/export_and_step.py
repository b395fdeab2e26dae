"""Export a model too large for its own gate, then load the bundle and decode a few tokens on the
Core AI runtime: that it runs, its load time and seconds per token, and that its logits are finite.

    python benchmarks/export_and_step.py qwen3.5-35b-a3b /tmp/b35 --quant int4 \\
        --json benchmarks/results/run_qwen3.5-35b-a3b-int4.json

MODEL is a preset (synthetic weights from its fixed seed) or PRESET:N (its first N layers). The
export skips the gate: at 35B its fp32 reference is ~140 GB. The JSON is rewritten after each
stage, so a run stopped partway keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hybrid_speed import synthetic_model  # noqa: E402

from ssmport.bundle import Bundle, dir_bytes  # noqa: E402
from ssmport.exporter.pipeline import export  # noqa: E402
from ssmport.runtime.runner import Runner  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("out", type=Path, help="where the bundle is written")
    p.add_argument("--quant", default="int4")
    p.add_argument("--tokens", type=int, nargs="+", default=[11, 2024, 7], help="token ids decoded, one call each")
    p.add_argument("--json", type=Path, required=True)
    a = p.parse_args()
    record: dict = {"model": a.model, "quant": a.quant}

    def save() -> None:
        a.json.write_text(json.dumps(record, indent=1, default=str))

    start = time.perf_counter()
    result = export(synthetic_model(a.model), a.out, quant=a.quant, gate=False, profile_memory=True, progress=False,
                    overwrite=True)  # fmt: skip
    record |= {"export_s": round(time.perf_counter() - start, 1), "memory": result.memory.to_json(),
               "asset_bytes": dir_bytes(result.path),
               "export": {k: v for k, v in result.manifest.export.items() if k != "memory"}}  # fmt: skip
    save()
    print("exported", record["export_s"], "s,", record["asset_bytes"], "bytes", flush=True)
    start = time.perf_counter()
    with Runner(Bundle.open(result.path)) as runner:
        record["load_s"] = round(time.perf_counter() - start, 1)
        save()
        print("loaded", record["load_s"], "s", flush=True)
        record["steps"] = []
        for token in a.tokens:
            start = time.perf_counter()
            logits = np.asarray(runner.step(token), dtype=np.float32).reshape(-1)
            step = {"token": token, "s": round(time.perf_counter() - start, 2), "finite": bool(np.isfinite(logits).all()),
                    "argmax": int(logits.argmax()), "max": float(logits.max()), "std": float(logits.std())}  # fmt: skip
            record["steps"].append(step)
            save()
            print("step", step, flush=True)


if __name__ == "__main__":
    main()
