"""Peak RSS and wall time of `ssmport export --synthetic --profile-memory`, one run per line.

A line is PRESET:RECIPE (synthetic weights) or CHECKPOINT:RECIPE (a .pth or folder on disk),
optionally :STEPS, that line's gate steps (default --gate-steps). fp16 and int8 calls are very
slow on this runtime (rwkv7-0.1b: one decode call 5.2 s fp16, 11 s int8keepproj, 28 ms fp32;
one 64-row prefill chunk 206 s fp16), so their large lines gate on 1 step, decode only (a gate
of 2+ steps feeds its first half through one prefill chunk).

Each line is a fresh process (`python -m ssmport.cli.main export PRESET --synthetic --quant Q
--profile-memory`), taking the heavy-work lock (/tmp/ssmport-heavy.lock) for its run only, with
its own lowering cache; the bundle and the lowered copy are deleted after the line is read, so
a 7B-class run needs its asset's size of free disk twice over (bundle + lowering), not more.
Per line: wall time, asset bytes, the whole run's peak RSS, the export's peak (everything
before the gate) and the gate's own peak (reference, lowering, runtime), each stage's peak, and
the goal 1.5 x asset + 2 GB. The load average before and after each run is recorded: the
machine is shared, so a loaded run is marked as such.

    python benchmarks/export_memory.py rwkv7-1.5b:fp32 rwkv7-1.5b:fp16 --json /tmp/mem.json
    python benchmarks/export_memory.py rwkv7-g1d-7.2b:int8keepproj:1 rwkv7-2.9b:fp16:1
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GB = 1e9
LOCK = "/tmp/ssmport-heavy.lock"
GATE_STAGES = ("fp32 reference", "Loading on Core AI runtime")  # and "Gate (...)"


@contextlib.contextmanager
def heavy_lock():
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_line(preset: str, quant: str, gate_steps: int, work: Path) -> dict:
    out, cache = work / "out", work / "cache"
    weights = [] if Path(preset).exists() else ["--synthetic"]  # a checkpoint file or folder: its own weights
    cmd = [sys.executable, "-m", "ssmport.cli.main", "export", preset, *weights, "--quant", quant,
           "-o", str(out), "--overwrite", "--profile-memory", "-q", "--gate-steps", str(gate_steps)]  # fmt: skip
    env = dict(os.environ, SSMPORT_CACHE=str(cache))
    with heavy_lock():
        load_before = os.getloadavg()
        started = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        load_after = os.getloadavg()
    line = {"preset": preset, "quant": quant, "command": " ".join(cmd[1:]), "exit": proc.returncode,
            "wall_s": round(wall, 1), "load_before": load_before, "load_after": load_after}  # fmt: skip
    manifests = list(out.glob("*/manifest.json"))
    if not manifests:
        line["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return line
    m = json.loads(manifests[0].read_text())
    memory = m["export"]["memory"]
    stages = memory["stages"]
    top = [s for s in stages if s["depth"] == 0]
    gate = [s for s in top if s["name"] in GATE_STAGES or s["name"].startswith("Gate (")]
    export = [s for s in top if s not in gate]
    asset = m["asset"]["bytes"]
    line |= {
        "asset_bytes": asset,
        "peak_mb": memory["peak_mb"],
        "export_peak_mb": max(s["peak_mb"] for s in export),
        "gate_peak_mb": max((s["peak_mb"] for s in gate), default=None),
        "goal_mb": round((1.5 * asset + 2 * GB) / 2**20, 1),
        "gate": m.get("gate", {}).get("passed"),
        "gate_steps": m.get("gate", {}).get("steps"),
        "gate_summary": m.get("gate"),
        "gate_line": next((ln for ln in proc.stdout.splitlines() if ln.startswith("gate:")), None),
        "stages": stages,
        "stdout": proc.stdout.strip().splitlines()[:3],
    }
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    return line


def table(lines: list[dict]) -> str:
    rows = ["| preset | recipe | asset | peak RSS (all) | export peak | gate peak | goal 1.5x+2 GB | wall | gate | load |",
            "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in lines:
        if "error" in r:
            rows.append(f"| {r['preset']} | {r['quant']} | failed: {' '.join(r['error'])} |||||||||")
            continue
        gb = lambda mb: f"{mb * 2**20 / GB:.2f} GB" if mb is not None else "-"  # noqa: E731
        ok = "PASS" if r["gate"] else ("FAIL" if r["gate"] is False else "-")
        rows.append(f"| {r['preset']} | {r['quant']} | {r['asset_bytes'] / GB:.2f} GB | {gb(r['peak_mb'])} | "
                    f"{gb(r['export_peak_mb'])} | {gb(r['gate_peak_mb'])} | {gb(r['goal_mb'])} | {r['wall_s']:.0f} s | "
                    f"{ok} ({r['gate_steps']} steps) | {r['load_before'][0]:.1f}/{r['load_after'][0]:.1f} |")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lines", nargs="+", help="PRESET:RECIPE[:STEPS] (synthetic weights) or CHECKPOINT:RECIPE[:STEPS], one export each")
    ap.add_argument("--gate-steps", type=int, default=8, help="gate steps of a line that names none")
    ap.add_argument("--json", type=Path, help="write every line (with its stage trace) here")
    ap.add_argument("--work", type=Path, help="where bundles go while measured (default: a temp dir)")
    args = ap.parse_args()
    lines = []
    for spec in args.lines:
        preset, _, rest = spec.partition(":")
        quant, _, steps = rest.partition(":")
        work = Path(tempfile.mkdtemp(prefix="export-memory-", dir=args.work))
        try:
            line = run_line(preset, quant or "fp32", int(steps) if steps else args.gate_steps, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        lines.append(line)
        print(table([line]).splitlines()[-1], flush=True)
        if args.json:
            args.json.write_text(json.dumps(lines, indent=1))
    print(table(lines))


if __name__ == "__main__":
    main()
