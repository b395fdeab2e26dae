"""Which Qwen3.5 weights can be int8: teacher-forced torch eager logits per predicate.

The same token streams go through the fp32 decode module and through int8 builds that keep
different weight roles in fp16 (int8 = symmetric, one fp16 scale per 32 inputs, the recipe's
storage); prints max |Δlogits| relative to the logit scale, and top-1 agreement.
`int8keepproj` is ssmport's predicate; each "+ X int8" row moves X to int8 on top of MLP + head
int8 (the predicate without its attention decision: rows measured before it was taken keep
their meaning), each "only X int8" row puts X alone in int8, the rest fp16.

    python benchmarks/qwen35_quant_predicate.py [--preset qwen3.5-tiny] [--layers N] [--steps 32] [--json F]

`--layers N` keeps a preset's widths with N layers (the 3 + 1 pattern), so the 0.8B widths
can be measured without the whole depth.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from ssmport.architectures import get_architecture
from ssmport.architectures import presets as all_presets
from ssmport.architectures.base import LoadedModel
from ssmport.models.qwen3_5.quant import KEEP_FLOAT_ROLES, role
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role

QKV = ("q_proj", "k_proj", "v_proj")


def _name_has(name: str, parts) -> bool:
    return any(p in name for p in parts)


def variants() -> dict[str, tuple[str, object]]:
    keep = lambda n: role(n) in KEEP_FLOAT_ROLES | {Role.ATTN_PROJ}  # noqa: E731  (MLP + head int8)
    return {
        "fp16 (no int8)": ("fp16", lambda n: True),
        "MLP + head int8": ("int8keepproj", keep),
        "int8keepproj": ("int8keepproj", lambda n: role(n) in KEEP_FLOAT_ROLES),
        "+ attn q/k/v int8": ("int8keepproj", lambda n: keep(n) and not (".self_attn." in n and _name_has(n, QKV))),
        "+ attn o_proj int8": ("int8keepproj", lambda n: keep(n) and not (".self_attn." in n and "o_proj" in n)),
        "+ attn q/k/v/o int8": ("int8keepproj", lambda n: keep(n) and ".self_attn." not in n),
        "+ linear out_proj int8": ("int8keepproj", lambda n: keep(n) and not (".linear_attn." in n and "out_proj" in n)),
        "+ linear in_proj int8": ("int8keepproj", lambda n: keep(n) and not (".linear_attn." in n and "in_proj" in n)),
        "int8 (all)": ("int8", lambda n: False),
        # one role alone in int8, everything else fp16: its own share of the error
        "only attn q/k/v/o int8": ("int8keepproj", lambda n: ".self_attn." not in n),
        "only linear out_proj int8": ("int8keepproj", lambda n: not (".linear_attn." in n and "out_proj" in n)),
    }


def decode_logits(model: LoadedModel, recipe: str, keeps_float, tokens: list[int]) -> np.ndarray:
    builder = WeightBuilder(get_recipe(recipe), keeps_float)
    with torch.no_grad():
        module = model.architecture.build_decode(model.config, model.weights, builder, torch.float32).eval()
        rows = [module(torch.tensor([[t]], dtype=torch.int32), torch.tensor([[p]], dtype=torch.int32)).float().reshape(-1)
                for p, t in enumerate(tokens)]  # fmt: skip
    return torch.stack(rows).numpy()


def model_for(preset: str, layers: int | None, seed: int) -> LoadedModel:
    p = all_presets()[preset]
    arch = get_architecture(p.architecture)
    config = dict(p.config)
    if layers:
        config["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    cfg = arch.config_from_json(config)
    return LoadedModel(arch, cfg, arch.synthetic_weights(cfg, seed), {"kind": "synthetic", "seed": seed}, name=preset)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="qwen3.5-tiny")
    p.add_argument("--layers", type=int, help="keep the preset's widths with this many layers")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--seeds", type=int, default=3, help="synthetic weight seeds")
    p.add_argument("--only", nargs="+", help="run just these variants (labels as printed)")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    torch.set_num_threads(1)  # a shared machine
    rows = {}
    started = time.perf_counter()
    models = [model_for(a.preset, a.layers, seed) for seed in range(a.seeds)]
    streams = [np.random.default_rng(s).integers(0, m.config.vocab_size, a.steps).tolist() for s, m in enumerate(models)]
    refs = [decode_logits(m, "fp32", lambda n: True, t) for m, t in zip(models, streams)]
    print(f"{a.preset}{f' ({a.layers} layers)' if a.layers else ''}, synthetic seeds 0..{a.seeds - 1}, "
          f"{a.steps} teacher-forced tokens each, torch eager")  # fmt: skip
    print(f"{'variant':24} {'max rel |Δ|':>12} {'top-1':>10}")
    chosen = {k: v for k, v in variants().items() if not a.only or k in a.only}
    for label, (recipe, keep) in chosen.items():
        worst, agree, total = 0.0, 0, 0
        for m, tokens, ref in zip(models, streams, refs):
            got = decode_logits(m, recipe, keep, tokens)
            worst = max(worst, float(np.abs(ref - got).max() / max(1.0, np.abs(ref).max())))
            agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
            total += len(tokens)
        rows[label] = {"max_rel_delta": worst, "top1": agree, "steps": total}
        print(f"{label:24} {worst:12.2e} {agree:>5}/{total}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"preset": a.preset, "layers": a.layers, "seeds": a.seeds, "steps": a.steps, "variants": rows,
                       "seconds": round(time.perf_counter() - started, 1)}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
