"""Whether a change altered the exported graphs: every tiny preset's decode and prefill graph,
fp32 and int8keepproj, printed from one tree and compared with another's.

A refactor that leaves every graph identical leaves the speed of every bundle identical, on
this runtime and on a device: a stronger check than timing it twice on a shared machine.

    PYTHONPATH=/path/to/tree-before python benchmarks/graph_diff.py dump before.json
    PYTHONPATH=/path/to/tree-after  python benchmarks/graph_diff.py dump after.json
    PYTHONPATH=$PWD python benchmarks/graph_diff.py dump rms.json --composite rms_norm   # a composite's graphs
    python benchmarks/graph_diff.py compare before.json after.json

The printed IR names decomposed helper functions with a random suffix and weights by a
content hash; both are normalized away, and the weights' bytes are left out (the parity tests
cover the values). `compare` reports, per graph, "identical", "same ops, reordered" (the same
multiset of ops: constants listed in another order, say), or the ops added and removed.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from ir_checks import graph_texts  # noqa: E402  (the tests' reading of a program's graphs)

PRESETS = ("rwkv7-tiny", "mamba2-tiny", "gated-deltanet-tiny", "qwen3.5-tiny", "lfm2-tiny", "granite-hybrid-tiny",
           "nemotron-h-tiny")  # fmt: skip
RECIPES = ("fp32", "int8keepproj")
CHUNK = 16


def normalized(text: str) -> str:
    text = text.split("{-#")[0]  # the resource blobs: the weights' bytes
    text = re.sub(r"(@[A-Za-z0-9_]+?)_[a-z]{8}\b", r"\1_X", text)  # @layer_norm_qrdcbxku -> @layer_norm_X
    return re.sub(r"resource_\d+", "resource_N", text)


def op_counts(text: str) -> collections.Counter:
    return collections.Counter(re.findall(r"= (coreai\.[a-z_.]+)", text))


def dump(out: Path, presets: list[str], layout: str = "ssmport", composites: tuple[str, ...] = ()) -> None:
    import torch

    from ssmport.exporter.convert import convert
    from ssmport.ops.composite import chosen
    from ssmport.quant import get_recipe
    from ssmport.quant.plan import WeightBuilder
    from ssmport.loader.resolve import load_model

    graphs = {}
    for preset in presets:
        model = load_model(preset, synthetic=True)
        for recipe in RECIPES:
            builder = WeightBuilder(get_recipe(recipe), model.architecture.keeps_float)
            with chosen(composites):
                program = convert(model, builder, torch.float32, prefill_chunk=CHUNK, layout=layout).program
            for function, text in graph_texts(program).items():
                graphs[f"{preset}/{recipe}/{function}" + ("" if layout == "ssmport" else f"/{layout}")] = normalized(text)
            print(preset, recipe, flush=True)
    out.write_text(json.dumps(graphs) + "\n")


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    changed = 0
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            print(f"{key:45} only in {'after' if key in b else 'before'}")
            changed += 1
            continue
        ops_a, ops_b = op_counts(a[key]), op_counts(b[key])
        if a[key] == b[key]:
            verdict = "identical"
        elif ops_a == ops_b:
            verdict = "same ops, reordered"
        else:
            changed += 1
            verdict = (f"ops {sum(ops_a.values())} -> {sum(ops_b.values())}: +{dict(ops_b - ops_a)} "
                       f"-{dict(ops_a - ops_b)}")  # fmt: skip
        print(f"{key:45} {verdict}")
    return 1 if changed else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="print this tree's graphs (the ssmport on PYTHONPATH) to a JSON file")
    d.add_argument("out", type=Path)
    d.add_argument("--preset", action="append", help=f"default: {', '.join(PRESETS)}")
    d.add_argument("--layout", default="ssmport", help="the bundle layout whose graphs to print (default ssmport)")
    d.add_argument("--composite", nargs="*", default=[], help="ops in coreai-torch's composite form (ssmport.ops.composite)")
    c = sub.add_parser("compare", help="exit 1 if any graph's ops differ")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    a = p.parse_args()
    if a.command == "dump":
        dump(a.out, a.preset or list(PRESETS), a.layout, tuple(a.composite))
    else:
        sys.exit(compare(a.before, a.after))


if __name__ == "__main__":
    main()
