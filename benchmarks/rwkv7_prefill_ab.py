"""RWKV-7 prefill from this tree against another checkout's (the commit before a change to the
chunk form, say), on the Core AI runtime. rwkv7-0.1b synthetic fp32, chunk 64: runtime ops per
call, and prefill speed and exactness against the M=1 loop (the two bundles alternated, twice).

    git worktree add /tmp/before <commit>
    flock /tmp/ssmport-heavy.lock python benchmarks/rwkv7_prefill_ab.py --before /tmp/before \\
        --out benchmarks/results/rwkv7_prefill_ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# benchmarks/ is on sys.path when run as a script
import prefill_speed

from ssmport.bundle import Bundle
from ssmport.runtime.op_count import count_ops

EXPORT = """import sys
import ssmport
if not ssmport.__file__.startswith(sys.argv[3]):
    print(f"imported ssmport from {ssmport.__file__}, not from {sys.argv[3]}", file=sys.stderr)
    raise SystemExit(3)
from ssmport.exporter.pipeline import export
from ssmport.loader.resolve import load_model
print(export(load_model(sys.argv[1], synthetic=True), sys.argv[2], quant="fp32", gate_steps=8, prefill_chunk=64,
             progress=False, overwrite=True).path)"""


def export_from(tree: Path, model: str, out: Path) -> Path:
    """The bundle `tree`'s ssmport exports, in a child process run from `tree` (`python -c`
    puts its working directory first on sys.path, ahead of PYTHONPATH and any install)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", EXPORT, model, str(out), str(tree)], env=env, cwd=tree,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:  # a failed gate still returns the bundle (exit 0): this is an error, or the wrong tree
        raise SystemExit(f"export from {tree} failed:\n{done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, required=True, help="a checkout of the tree to compare with")
    p.add_argument("--model", default="rwkv7-0.1b")
    p.add_argument("--prompts", nargs="+", type=int, default=[64, 512])
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rwkv7-prefill-ab-"))
    trees = {"before": a.before.resolve(), "this tree": Path(__file__).resolve().parents[1]}
    results = {}
    try:
        for label, tree in trees.items():
            path = export_from(tree, a.model, work / label.replace(" ", "-"))
            ops = {f: c.ops for f, c in count_ops(Bundle.open(path)).items()}
            print(f"{label}: runtime ops per call {ops}", flush=True)
            results[label] = {"tree": str(tree), "path": path, "ops": ops, "runs": []}
        for _ in range(2):  # alternated, so background load hits both alike
            for label, r in results.items():
                print(label, flush=True)
                rows, share = prefill_speed.measure(r["path"], a.prompts, 2, seed=0)
                r["runs"].append({"prompts": rows, "recurrence": share})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for r in results.values():
        del r["path"]
    if a.out:
        a.out.write_text(json.dumps({"model": a.model, "trees": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
