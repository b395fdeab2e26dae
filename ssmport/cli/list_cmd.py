"""ssmport list: architectures, presets, and (with --recipes) quantization recipes."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("list", help="architectures and presets (--recipes: quantization recipes)")
    p.add_argument("--recipes", action="store_true", help="list quantization recipes")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.recipes:
        from ssmport.quant import RECIPES

        for r in RECIPES.values():
            print(f"{r.name:14} {r.description}")
            floor, runtime = r.gate.floor_factor, r.gate.runtime_floor_factor
            widened = (f" (or {floor:g} x the fp32 reference's own distance from fp64, if larger; judged vs fp64)" if floor
                       else f" (or {runtime:g} x the fp16 floor, if larger: the reference in fp16 with this runtime's "
                            "sums; the recipe alone within the first)" if runtime else "")  # fmt: skip
            print(f"{'':14} gate: max |Δlogits| <= {r.gate.max_rel_logit_delta:g} x logit scale{widened}"
                  + f"; flips excused where the reference top-2 margin < {r.gate.tie_rel_margin:g} x scale"
                  + (f"; top-1 on >= {r.gate.min_top1:.0%} of steps" if r.gate.min_top1 < 1 else ""))  # fmt: skip
        return 0
    from ssmport.architectures import architectures

    width = max((len(p.name) for arch in architectures() for p in arch.presets), default=0)
    for arch in architectures():
        print(f"{arch.name}: {arch.description}")
        for p in arch.presets:
            print(f"  {p.name:{width}} {p.description}  [{_source(p)}]")
    return 0


def _source(preset) -> str:
    """Where `ssmport export <preset>` gets its weights."""
    from ssmport.loader.pretrained import bundled_checkpoint

    if not preset.released:
        return "embedded, synthetic"
    if bundled_checkpoint(preset.name):
        return "embedded, trained weights"
    if preset.hub is None:
        return "no download source: needs --weights or --synthetic"
    hub = preset.hub
    where = f"{hub.repo}{'@' + hub.revision if hub.revision else ''}{': ' + hub.file if hub.file else ''}"
    return f"Hub {where}" + ("" if hub.confirmed else "; source not confirmed")
