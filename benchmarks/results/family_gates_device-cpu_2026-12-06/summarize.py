"""The table of docs/quantization.md ("Gate verdicts at the smallest released size") from this
folder's logs and gate summaries (here/: a gate rerun on the 2-core machine where the GPU
machine's time ran out): python summarize.py"""

import json
import re
from pathlib import Path

HERE = Path(__file__).parent
RECIPES = ["fp32", "fp16", "int8keepproj", "int4keepproj", "int4"]


def cell(name: str, folder: Path = HERE) -> str:
    log = (folder / f"{name}.log").read_text()
    asset = int(re.search(r"asset_bytes (\d+)", log).group(1))
    gate = re.search(r"gate rc=\d+ (\d+) s", log)
    summary = folder / f"{name}.json"
    if (gate is None or not summary.stat().st_size) and (folder / "here" / f"{name}.log").exists():
        return cell(name, folder / "here") + " (here)"  # rerun on the 2-core machine: here/run.sh
    if gate is None or not summary.stat().st_size:
        return f"{asset / 1e6:,.0f} MB, no verdict: the gate was still running when the machine's time ran out"
    s = json.loads(summary.read_text())
    n = s["steps"] * s["prompts"]
    ties = f"+{s['top1_excused_ties']}" if s["top1_excused_ties"] else ""
    split = s.get("recipe_split")
    recipe = f" (recipe {split['recipe_vs_reference_rel']:.3f})" if split else ""
    verdict = "PASS" if s["passed"] else "**FAIL**"
    return (f"{asset / 1e6:,.0f} MB, {verdict} {s['max_rel_logit_delta']:.3g}{recipe} / "
            f"{s['thresholds']['max_rel_logit_delta']:g}, {s['top1_agree']}{ties}/{n}, {int(gate.group(1)) / 60:.1f} min")


presets = sorted({p.stem.rsplit("-", 1)[0] for p in HERE.glob("*.log")}, key=lambda p: p)
print("| preset | " + " | ".join(RECIPES) + " |")
print("|---" * (len(RECIPES) + 1) + "|")
for preset in presets:
    cells = [cell(f"{preset}-{q}") if (HERE / f"{preset}-{q}.log").exists() else "" for q in RECIPES]
    print(f"| {preset} | " + " | ".join(cells) + " |")
