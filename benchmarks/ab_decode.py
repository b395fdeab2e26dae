"""Decode ms/token of two checkouts of ssmport on the same bundles, alternated in one run.

    python benchmarks/ab_decode.py --before /tmp/base --after . --models rwkv7-0.1b mamba2-130m qwen3.5-tiny

For a change that should not alter the graphs (benchmarks/graph_diff.py says whether it
does), each bundle is exported once, by the `--after` tree (synthetic fp32, no gate, with
its prefill), and both trees' own runners time it with `ssmport bench --no-roofline --json`,
alternating which goes first from round to round, so drift in the machine's load falls on both.
Prints (and with --json writes) each model's median of the rounds' medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np


def ssmport(tree: str, *args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
    done = subprocess.run([sys.executable, "-m", "ssmport.cli.main", *args], env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{tree}: ssmport {' '.join(args)} failed:\n{done.stderr.strip()}")
    return done.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="checkout before the change")
    p.add_argument("--after", required=True, help="checkout after it (it exports the bundles)")
    p.add_argument("--models", nargs="+", required=True, help="presets (exported --synthetic)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--context", type=int, help="--context of the exports (a tiny hybrid holds 64 by default)")
    p.add_argument("--work", default="/tmp/ab_decode")
    p.add_argument("--json", metavar="OUT")
    a = p.parse_args()
    rows = []
    for model in a.models:
        context = ["--context", str(a.context)] if a.context else []
        ssmport(a.after, "export", model, "--synthetic", "--quant", "fp32", "--no-gate", "-o", a.work,
                "--name", model, "--overwrite", "-q", *context)  # fmt: skip
        bundle = str(Path(a.work, model))
        times: dict[str, list[float]] = {"before": [], "after": []}
        for round_ in range(a.rounds):
            order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
            for which in order:
                tree = a.before if which == "before" else a.after
                out = json.loads(ssmport(tree, "bench", bundle, "--steps", str(a.steps), "--no-roofline", "--json"))
                times[which].append(out["decode_ms_per_token"])
        before, after = (float(np.median(times[w])) for w in ("before", "after"))
        rows.append({"model": model, "before_ms": before, "after_ms": after, "ratio": after / before, "rounds": times})
        print(f"{model:16} before {before:8.2f}  after {after:8.2f} ms/token  after/before {after / before:.3f}  "
              f"(rounds: {times})", flush=True)  # fmt: skip
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
