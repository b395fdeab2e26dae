"""What `--quant auto --size-budget SIZE` chooses for a model, without exporting it: the measured
sensitivity table and the choice (ssmport.quant.auto.plan_auto), the conversion skipped.

    python benchmarks/auto_plan.py qwen3.5-4b 2.5GB --synthetic --json benchmarks/results/auto_plan_qwen3.5-4b.json

A synthetic preset generates its LM head apart from its embedding, tied or not (each tensor
from (seed, name)): `--tie-head` reads the head from the embedding instead, as a tied checkpoint's
loader does, so that `auto`'s tied forms (the table read from the int8 head) are measured.
"""

from __future__ import annotations

import argparse
import json
import time

from dataclasses import replace

from ssmport.loader.checkpoint import TensorSource
from ssmport.quant.auto import plan_auto
from ssmport.quant.budget import parse_size
from ssmport.loader.resolve import load_model

HEAD, EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"  # transformers' names (Qwen3.5, LFM2, ...)


class TiedHead(TensorSource):
    """`source` with its LM head read from its embedding (the tied-head rule of models.loading)."""

    def __init__(self, source: TensorSource):
        if HEAD not in source or EMBEDDING not in source:
            raise SystemExit(f"--tie-head: {source.origin} has no {HEAD} and {EMBEDDING}")
        self.source, self.origin = source, f"{source.origin} (head tied)"

    def _name(self, name: str) -> str:
        return EMBEDDING if name == HEAD else name

    def __getitem__(self, name):
        return self.source[self._name(name)]

    def __iter__(self):
        return iter(self.source)

    def __len__(self):
        return len(self.source)

    def shape(self, name):
        return self.source.shape(self._name(name))

    def dtype(self, name):
        return self.source.dtype(self._name(name))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("budget", help="e.g. 2.5GB")
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--json", help="write the plan record here")
    ap.add_argument("--tie-head", action="store_true", help="read the LM head from the embedding (a tied checkpoint)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the calibration steps (a 4B model on a many-core machine)")
    args = ap.parse_args()
    started = time.perf_counter()
    model = load_model(args.model, synthetic=args.synthetic)
    if args.tie_head:
        model = replace(model, weights=TiedHead(model.weights))
    passes = [0]
    plan = plan_auto(model, parse_size(args.budget), on_pass=lambda: passes.__setitem__(0, passes[0] + 1),
                     threads=args.threads)
    r = plan.record
    print(f"{args.model}{' (synthetic)' if args.synthetic else ''}, budget {args.budget}: weights {r['plan_bytes']:,} "
          f"bytes + {r['reserved_for_graph_bytes']:,} reserved; per {r['granularity']}; {passes[0]} passes of "
          f"{r['calibration']['steps']} steps; {time.perf_counter() - started:.0f} s")  # fmt: skip
    for g in r["sensitivity"]:
        mse = "  ".join(f"{f} {v:.2e}" for f, v in g["mse"].items())
        print(f"  {g['group'][:48]:48} {g['chosen']:8} {g['bytes'][g['chosen']]:>14,}  {mse}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "synthetic": args.synthetic, "tie_head": args.tie_head, "budget": args.budget}
                      | r, f, indent=1)  # fmt: skip
            f.write("\n")


if __name__ == "__main__":
    main()
