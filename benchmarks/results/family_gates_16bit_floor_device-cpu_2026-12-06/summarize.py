"""The table of docs/quantization.md ("The 16-bit gates' noise floor": the gates run again) from
this folder's gate summaries and logs, with the verdicts of the same gates before the floor
(../family_gates_device-cpu_2026-12-06). python summarize.py"""

import json
import re
from pathlib import Path

HERE = Path(__file__).parent
BEFORE = HERE.parent / "family_gates_device-cpu_2026-12-06"

print("| preset | recipe | bundle | its twin | fp16 floor | recipe alone | limit | verdict (before) | top-1 | gate |")
print("|---" * 10 + "|")
for path in sorted(HERE.glob("*.json")):
    s, name = json.loads(path.read_text()), path.stem
    preset, recipe = name.rsplit("-", 1)
    before = json.loads((BEFORE / path.name).read_text())
    r, split = s["runtime_floor"], s["recipe_split"]
    gate_s = int(re.search(r"gate rc=\d+ (\d+) s", (HERE / f"{name}.log").read_text()).group(1))
    ties = f"+{s['top1_excused_ties']}" if s["top1_excused_ties"] else ""
    verdict = lambda x: "PASS" if x["passed"] else "**FAIL**"  # noqa: E731
    print(f"| {preset} | {recipe} | {s['max_rel_logit_delta']:.3g} | {r['bundle_vs_twin_rel']:.3g} | "
          f"{r['reference_in_fp16_vs_reference_rel']:.3g} | {split['recipe_vs_reference_rel']:.3g} | {r['limit_rel']:.3g} | "
          f"{verdict(s)} ({verdict(before)}, limit {before['thresholds']['max_rel_logit_delta']:g}) | "
          f"{s['top1_agree']}{ties}/{s['steps'] * s['prompts']} | {gate_s / 60:.1f} min |")
