"""Runtime ops per layer, per family and layer kind: one decode call and one prefill chunk of
every built-in's tiny preset, and of the same preset with one more layer of each kind, all fp32
in the default layout, counted by the runtime's profiler (ssmport.runtime.op_count).

    PYTHONPATH=$PWD python benchmarks/ops_per_layer.py [--presets rwkv7-tiny ...] [--json out.json]

A layer of one kind runs the same ops wherever it sits, so the ops one more layer adds are that
kind's ops per layer; outside = what the embedding, the head and the once-per-call state
writes cost (the preset's ops less its layers'). A config lists its layers (`layer_types`,
Nemotron-H's `pattern`) or counts them (`num_layers`); a preset with neither is named and
skipped.

`--classes` adds a second table: each layer kind's decode ops split into matmuls, arithmetic
(elementwise math and reductions: a step of the formula each) and layout (reshapes, slices,
splits, concats, transposes, broadcasts, gathers and scatters: moving data, not computing it),
and what a layer would keep with every layout op gone. Where that is more than half the layer,
halving its ops (issue 32, part 3) needs fewer steps of arithmetic, not only a better shape.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import tempfile
import warnings
from pathlib import Path

COUNT_FIELDS = ("num_layers", "num_hidden_layers")  # an int layer count
LIST_FIELDS = ("layer_types", "pattern")  # one entry per layer (Nemotron-H: a string)

# The runtime's kernel types by what they do (ssmport.runtime.op_count.op_type names, as this
# runtime's profiles of ssmport's graphs name them); any other type counts as arithmetic.
MATMUL_TYPES = frozenset({"broadcasting_batch_matmul"})
LAYOUT_TYPES = frozenset({"reshape", "slice", "split", "concat", "transpose", "reverse", "broadcast_in_dims",
                          "broadcast_to", "expand_dims", "gather_nd", "gather_along_axis", "scatter_nd"})  # fmt: skip
CONTROL_TYPES = frozenset({"if"})
CLASSES = ("matmul", "arithmetic", "layout", "control")


def op_class(kind: str) -> str:
    """matmul, layout, control or arithmetic (everything else: elementwise math, reductions)."""
    if kind in MATMUL_TYPES:
        return "matmul"
    if kind in LAYOUT_TYPES:
        return "layout"
    return "control" if kind in CONTROL_TYPES else "arithmetic"


def by_class(types: dict[str, int]) -> dict[str, int]:
    """Kernel counts per class from counts per op type (a per-layer difference may be negative)."""
    out = dict.fromkeys(CLASSES, 0)
    for kind, n in types.items():
        out[op_class(kind)] += n
    return out


def plus_one(config) -> dict[str, object] | None:
    """{layer kind: the config with one more layer of that kind}, or None where it has no field
    for its layers."""
    names = {f.name for f in dataclasses.fields(config)}
    for name in LIST_FIELDS:
        if name in names:
            layers = getattr(config, name)
            return {kind: dataclasses.replace(config, **{name: layers + type(layers)([kind])}) if not isinstance(layers, str)
                    else dataclasses.replace(config, **{name: layers + kind}) for kind in dict.fromkeys(layers)}  # fmt: skip
    for name in COUNT_FIELDS:
        if name in names:
            return {"layer": dataclasses.replace(config, **{name: getattr(config, name) + 1})}
    return None


def counts(model, folder: Path) -> tuple[dict, dict[str, int]]:
    """({main, prefill}: the kernels of one decode call and of one prefill chunk, the decode
    call's kernels per op type)."""
    import ssmport
    from ssmport.bundle import Bundle
    from ssmport.runtime.op_count import count_ops

    result = ssmport.export(model, folder, quant="fp32", gate=False, progress=False)
    c = count_ops(Bundle.open(result.path))
    return {"main": c["main"].ops, "prefill": c["prefill"].ops if "prefill" in c else None}, c["main"].by_type


def measure(preset: str, folder: Path) -> list[dict] | None:
    """One row per layer kind: the preset's ops and that kind's ops per layer."""
    from ssmport.loader.resolve import load_model

    model = load_model(preset, synthetic=True)
    more = plus_one(model.config)
    if more is None:
        return None
    arch = model.architecture
    base, base_types = counts(model, folder / "base")
    fields = {f.name for f in dataclasses.fields(model.config)}
    listed = next((getattr(model.config, n) for n in LIST_FIELDS if n in fields), None)
    mix = collections.Counter(listed) if listed is not None else {"layer": model.config.num_layers}
    rows = []
    for kind, cfg in more.items():
        plus, plus_types = counts(dataclasses.replace(model, config=cfg, weights=arch.synthetic_weights(cfg, 0)), folder / kind)
        types = {t: plus_types.get(t, 0) - base_types.get(t, 0) for t in plus_types.keys() | base_types.keys()}
        rows.append({"family": arch.name, "preset": preset, "kind": kind, "of_kind": mix[kind],
                     "layers": model.config.num_layers, "base": base,
                     "per_layer": {f: None if base[f] is None else plus[f] - base[f] for f in base},
                     "per_layer_types": {t: n for t, n in sorted(types.items(), key=lambda i: (-i[1], i[0])) if n},
                     "per_layer_classes": by_class(types)})  # fmt: skip
    for f in base:  # what is not a layer's: the preset's ops less its layers'
        if base[f] is not None:
            outside = base[f] - sum(r["per_layer"][f] * r["of_kind"] for r in rows)
            for r in rows:
                r.setdefault("outside", {})[f] = outside
    return rows


def print_classes(rows: list[dict]) -> None:
    """Each layer kind's decode ops by class, and whether halving them needs arithmetic to go."""
    print("\n| family | layer kind | decode ops per layer | matmul | arithmetic | layout | control | "
          "left with no layout op | half the layer | halving needs arithmetic to go |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c, total = r["per_layer_classes"], r["per_layer"]["main"]
        left = total - c["layout"]
        print(f"| {r['family']} | {r['kind']} | {total} | {c['matmul']} | {c['arithmetic']} | {c['layout']} | "
              f"{c['control']} | {left} | {total / 2:g} | {'yes' if left > total / 2 else 'no'} |")  # fmt: skip


def main() -> None:
    warnings.simplefilter("ignore")
    from ssmport.architectures import architectures

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=[a.tiny_preset for a in architectures() if a.tiny_preset])
    p.add_argument("--json", type=Path)
    p.add_argument("--classes", action="store_true", help="also each layer kind's decode ops by class (matmul, arithmetic, layout)")
    a = p.parse_args()
    rows = []
    print("| family | tiny preset (layers) | layer kind (how many) | ops / decode call: per layer | whole call | outside layers | "
          "ops / prefill chunk: per layer | whole chunk | outside layers |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for preset in a.presets:
        with tempfile.TemporaryDirectory() as tmp:
            found = measure(preset, Path(tmp))
        if found is None:
            print(f"| {preset}: no layer field to extend, skipped |")
            continue
        rows += found
        for r in found:
            cells = [f"{r['per_layer'][f]} | {r['base'][f]} | {r['outside'][f]}" if r["base"][f] is not None
                     else "- | - | -" for f in ("main", "prefill")]  # fmt: skip
            print(f"| {r['family']} | {preset} ({r['layers']}) | {r['kind']} ({r['of_kind']}) | {cells[0]} | {cells[1]} |",
                  flush=True)  # fmt: skip
    if a.classes:
        print_classes(rows)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
