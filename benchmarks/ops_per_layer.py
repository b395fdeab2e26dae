"""Runtime ops per layer, per family and layer kind: one decode call and one prefill chunk of
every built-in's tiny preset, and of the same preset with one more layer of each kind, all fp32
in the default layout, counted by the runtime's profiler (ssmport.runtime.op_count).

    PYTHONPATH=$PWD python benchmarks/ops_per_layer.py [--presets rwkv7-tiny ...] [--json out.json]

A layer of one kind runs the same ops wherever it sits, so the ops one more layer adds are that
kind's ops per layer; outside = what the embedding, the head and the once-per-call state
writes cost (the preset's ops less its layers'). A config lists its layers (`layer_types`,
Nemotron-H's `pattern`) or counts them (`num_layers`); a preset with neither is named and
skipped.
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


def counts(model, folder: Path) -> dict:
    import ssmport
    from ssmport.bundle import Bundle
    from ssmport.runtime.op_count import count_ops

    result = ssmport.export(model, folder, quant="fp32", gate=False, progress=False)
    c = count_ops(Bundle.open(result.path))
    return {"main": c["main"].ops, "prefill": c["prefill"].ops if "prefill" in c else None}


def measure(preset: str, folder: Path) -> list[dict] | None:
    """One row per layer kind: the preset's ops and that kind's ops per layer."""
    from ssmport.loader.resolve import load_model

    model = load_model(preset, synthetic=True)
    more = plus_one(model.config)
    if more is None:
        return None
    arch = model.architecture
    base = counts(model, folder / "base")
    fields = {f.name for f in dataclasses.fields(model.config)}
    listed = next((getattr(model.config, n) for n in LIST_FIELDS if n in fields), None)
    mix = collections.Counter(listed) if listed is not None else {"layer": model.config.num_layers}
    rows = []
    for kind, cfg in more.items():
        plus = counts(dataclasses.replace(model, config=cfg, weights=arch.synthetic_weights(cfg, 0)), folder / kind)
        rows.append({"family": arch.name, "preset": preset, "kind": kind, "of_kind": mix[kind],
                     "layers": model.config.num_layers, "base": base,
                     "per_layer": {f: None if base[f] is None else plus[f] - base[f] for f in base}})  # fmt: skip
    for f in base:  # what is not a layer's: the preset's ops less its layers'
        if base[f] is not None:
            outside = base[f] - sum(r["per_layer"][f] * r["of_kind"] for r in rows)
            for r in rows:
                r.setdefault("outside", {})[f] = outside
    return rows


def main() -> None:
    warnings.simplefilter("ignore")
    from ssmport.architectures import architectures

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=[a.tiny_preset for a in architectures() if a.tiny_preset])
    p.add_argument("--json", type=Path)
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
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
