"""The 16-bit gates of this folder judged again by the rule that came after them (2026-12-06,
fifth session; docs/parity.md): limit max(the recipe's, 2 x the fp16 floor), the recipe alone
(fp32 sums) within the recipe's limit, a flip excused below max(the tie margin, 2 x the floor).
The floors are torch-only runs on the same streams (fp16_floors.json: `python
benchmarks/fp16_gate_floor.py PRESET... --json`; each one's logit scale equals its gates'). The
summaries hold no per-step margins, so a recorded top-1 mismatch stays one here, and a cell
whose wider tie margin could have excused it says so. python rejudge.py"""

import json
from pathlib import Path

HERE = Path(__file__).parent
FACTOR = 2.0
RECIPES = ["fp16", "int8keepproj", "int4keepproj", "int4"]


def summary(name: str) -> dict | None:
    for p in (HERE / f"{name}.json", HERE / "here" / f"{name}.json"):
        if p.exists() and p.stat().st_size:
            return json.loads(p.read_text())
    return None


def cell(s: dict, floor: dict) -> str:
    assert abs(s["logit_scale"] - max(1.0, floor["logit_scale"])) < 1e-3 * s["logit_scale"], "not the same streams"
    t = s["thresholds"]
    fixed, tie = t["max_rel_logit_delta"], t["tie_rel_margin"]
    limit = max(fixed, FACTOR * floor["floor_rel"])
    recipe = s["recipe_split"]["recipe_vs_reference_rel"]
    over = [why for why, bad in ((f"bundle {s['max_rel_logit_delta']:.3g} > {limit:.3g}", s["max_rel_logit_delta"] > limit),
                                 (f"recipe {recipe:.3g} > {fixed:g}", recipe > fixed),
                                 (f"{s['top1_mismatch']} top-1 mismatch", s["top1_mismatch"] > 0)) if bad]  # fmt: skip
    maybe = " (a wider tie margin might excuse it)" if s["top1_mismatch"] and FACTOR * floor["floor_rel"] > tie else ""
    before = "PASS" if s["passed"] else "FAIL"
    now = "PASS" if not over else "**FAIL** (" + "; ".join(over) + maybe + ")"
    return f"{before} → {now}, limit {limit:.3g}"


floors = {f["preset"]: f for f in json.loads((HERE / "fp16_floors.json").read_text())}
print("| preset | fp16 floor (of scale) | " + " | ".join(RECIPES) + " |")
print("|---" * (len(RECIPES) + 2) + "|")
for preset, floor in floors.items():
    cells = []
    for q in RECIPES:
        s = summary(f"{preset}-{q}")
        cells.append("" if s is None else cell(s, floor))
    if any(cells):
        print(f"| {preset} | {floor['floor_rel']:.3g} | " + " | ".join(cells) + " |")
