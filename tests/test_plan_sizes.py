"""benchmarks/plan_sizes.py's shape-only plan: a recipe's build from meta tensors records the
same plan, tensor for tensor, as its build from the weights (every tiny preset), and matches
the bytes released-size exports wrote."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from plan_sizes import plan_entries, plan_summary  # noqa: E402

from ssmport.architectures import architectures  # noqa: E402
from ssmport.loader.resolve import load_model  # noqa: E402

TINY = [a.tiny_preset for a in architectures() if type(a).__module__.startswith("ssmport.models.") and a.tiny_preset]


@pytest.mark.parametrize("preset", TINY)
def test_the_shape_only_plan_is_the_built_plan(preset):
    model = load_model(preset, synthetic=True, seed=0)
    for recipe in ("int8keepproj", "int4keepproj", "int4"):
        built = plan_entries(model, recipe, meta=False)
        assert built and plan_entries(model, recipe, meta=True) == built, f"{preset} {recipe}"


@pytest.mark.parametrize("preset, recipe, written", [
    ("rwkv7-1.5b", "int8keepproj", 2_175_868_928),  # docs/quantization.md, "Sizes and export cost at 1.5B"
    ("lfm2-8b-a1b", "int4", 4_965_332_736),  # results/hybrid_speed_lfm2-8b-a1b-int4_device-cpu_2026-12-06.json
])  # fmt: skip
def test_released_size_plans_are_what_their_exports_wrote(preset, recipe, written):
    model = load_model(preset, synthetic=True, seed=0)
    assert plan_summary(model, recipe)["total"] == written
