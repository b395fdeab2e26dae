"""Quantization recipes, as data.

A recipe says how each weight is stored. Which weights feed the recurrence (and so stay in
float) is not the recipe's business: each architecture's `keeps_float(name)` predicate
decides that, and `int8keepproj` applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ssmport.errors import SsmportError

BLOCK_SIZE = 32  # int8 block length along a matmul's input dimension


@dataclass(frozen=True)
class GateThresholds:
    """What a teacher-forced gate of this recipe against the fp32 torch reference must meet.

    - `max_abs_logit_delta`: bound on max |Δlogits| over all steps, relative to the logit
      scale (the reference's max |logit| over the run, at least 1).
    - `tie_margin`: a top-1 disagreement is excused only where the reference's top-2
      margin (in logits) is below this; excused steps are counted separately.
    - `min_top1`: fraction of steps whose top-1 must agree outright or be excused (1.0:
      every disagreement must be a near-tie).
    """

    max_rel_logit_delta: float
    tie_margin: float
    min_top1: float = 1.0


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    float_dtype: torch.dtype  # storage and matmul dtype of float matmul weights and tables
    int8: str  # "none" | "bulk" (matmuls the architecture does not keep float) | "all"
    gate: GateThresholds

    def stores_int8(self, name: str, is_matmul: bool, keeps_float: bool) -> bool:
        if not is_matmul or self.int8 == "none":
            return False
        return self.int8 == "all" or not keeps_float

    @property
    def logits_dtype(self) -> torch.dtype:
        return self.float_dtype


# Threshold rationale (docs/parity.md has the measurements behind them):
# fp32 export vs fp32 torch differ only by summation order: ~1e-6 of the logit scale, so
# 1e-4 leaves two orders of headroom. fp16 on the Linux runtime accumulates matmuls in
# fp16 (see CORE_AI_NOTES), so logits move by up to a few percent of their scale; the
# per-step top-1 must still agree except at near-ties.
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "fp32",
            "Reference: every weight and all compute in fp32.",
            torch.float32,
            "none",
            GateThresholds(max_rel_logit_delta=1e-4, tie_margin=1e-3),
        ),
        Recipe(
            "fp16",
            "fp16 matmul weights and embedding, fp16 matmuls; residual stream, norms, gates "
            "and the recurrence in fp32 (per-channel vectors stay fp32).",
            torch.float16,
            "none",
            GateThresholds(max_rel_logit_delta=0.05, tie_margin=0.05),
        ),
        Recipe(
            "int8keepproj",
            "int8 weights (symmetric, one fp16 scale per 32 inputs) on the weight bulk (FFN, "
            "LM head); projections that feed the recurrence, LoRAs and embeddings stay fp16, "
            "norms and per-channel vectors fp32.",
            torch.float16,
            "bulk",
            GateThresholds(max_rel_logit_delta=0.08, tie_margin=0.08),
        ),
        Recipe(
            "int8",
            "The same int8 on every matmul, state projections and LoRAs included (for "
            "comparison; int8 on the recurrence inputs flips borderline tokens).",
            torch.float16,
            "all",
            GateThresholds(max_rel_logit_delta=0.12, tie_margin=0.12),
        ),
    )
}


# Storing the recurrent state in fp16 rounds what is carried between steps. Measured on
# rwkv7-0.1b (synthetic weights) over 2,048 teacher-forced tokens: max |Δlogits| ~0.01 at
# logit scale ~11 (~1e-3 relative), flat over time, top-1 equal on 2,041/2,048 steps
# (benchmarks/state_drift.py). A gate of an fp16-state bundle allows that on top of its recipe.
FP16_STATE_GATE = GateThresholds(max_rel_logit_delta=5e-3, tie_margin=0.02)


def gate_thresholds(recipe: Recipe, state_dtype: str) -> GateThresholds:
    """The recipe's thresholds, widened to the fp16-state budget when the state is fp16."""
    if state_dtype != "float16":
        return recipe.gate
    return GateThresholds(
        max_rel_logit_delta=max(recipe.gate.max_rel_logit_delta, FP16_STATE_GATE.max_rel_logit_delta),
        tie_margin=max(recipe.gate.tie_margin, FP16_STATE_GATE.tie_margin),
        min_top1=min(recipe.gate.min_top1, FP16_STATE_GATE.min_top1),
    )


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise SsmportError(f"unknown --quant {name!r}; choose one of: {', '.join(RECIPES)}")
    return RECIPES[name]
