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

    Both bounds are relative to the logit scale, so they mean the same for a model whose
    logits span 10 and one whose logits span 30:

    - `max_rel_logit_delta`: max |Δlogits| over all steps / the run's logit scale (the
      reference's max |logit| over the run, at least 1).
    - `tie_rel_margin`: a top-1 disagreement is excused as a near-tie only where the
      reference's own top-2 margin is below this fraction of that step's logit scale.
    - `min_top1`: fraction of steps that must agree outright or be excused near-ties.
    """

    max_rel_logit_delta: float
    tie_rel_margin: float
    min_top1: float = 1.0


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    float_dtype: torch.dtype  # storage and matmul dtype of float matmul weights and tables
    int8: str  # "none" | "bulk" (matmuls the architecture does not keep float) | "all"
    gate: GateThresholds

    def stores_int8(self, keeps_float: bool) -> bool:
        """Whether a matmul weight is int8 under this recipe, given the architecture's
        verdict on it (`keeps_float`: it feeds the recurrence, or is otherwise sensitive)."""
        if self.int8 == "none":
            return False
        return self.int8 == "all" or not keeps_float

    @property
    def logits_dtype(self) -> torch.dtype:
        return self.float_dtype


# Thresholds, from measurements in docs/parity.md (rwkv7-0.1b and rwkv7-tiny with
# synthetic weights, torch eager and the Core AI runtime):
# - fp32: only summation order differs (<= 7e-6 of scale measured); 1e-4 leaves headroom.
# - fp16: weight rounding alone gave <= 1.5e-2 (torch); the Linux runtime accumulates fp16
#   matmuls in fp16 and reached 3.3e-2 on rwkv7-0.1b, flipping a first-step top-1 whose
#   reference margin was 1.2e-2 of scale. int8keepproj computes its matmuls the same way.
# - int8keepproj: <= 7.4e-2 in torch, 9.2e-2 on Core AI (rwkv7-0.1b); flips only where the
#   reference margin was <= 1.1e-2 of scale.
# - int8: the comparison recipe. int8 on the projections into the recurrence produced
#   outliers up to 0.23 of scale and a flip at a 4.2e-2 margin; it may miss 3% of steps.
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "fp32",
            "Reference: every weight and all compute in fp32.",
            torch.float32,
            "none",
            GateThresholds(max_rel_logit_delta=1e-4, tie_rel_margin=1e-4),
        ),
        Recipe(
            "fp16",
            "fp16 matmul weights and embedding, fp16 matmuls; residual stream, norms, gates "
            "and the recurrence in fp32 (per-channel vectors stay fp32).",
            torch.float16,
            "none",
            GateThresholds(max_rel_logit_delta=0.06, tie_rel_margin=0.02),
        ),
        Recipe(
            "int8keepproj",
            "int8 weights (symmetric, one fp16 scale per 32 inputs) on the weight bulk (FFN, "
            "LM head); projections that feed the recurrence, LoRAs and embeddings stay fp16, "
            "norms and per-channel vectors fp32.",
            torch.float16,
            "bulk",
            GateThresholds(max_rel_logit_delta=0.15, tie_rel_margin=0.02),
        ),
        Recipe(
            "int8",
            "The same int8 on every matmul, state projections and LoRAs included (for "
            "comparison; int8 on the recurrence inputs flips borderline tokens).",
            torch.float16,
            "all",
            GateThresholds(max_rel_logit_delta=0.3, tie_rel_margin=0.05, min_top1=0.97),
        ),
    )
}


# Storing the recurrent state in fp16 rounds what is carried between steps. Measured on
# rwkv7-0.1b (synthetic weights) over 2,048 teacher-forced tokens: max |Δlogits| ~0.01 at
# logit scale ~11 (~1e-3 relative), flat over time, top-1 equal on 2,041/2,048 steps
# (benchmarks/state_drift.py). A gate of an fp16-state bundle allows that on top of its recipe.
FP16_STATE_GATE = GateThresholds(max_rel_logit_delta=5e-3, tie_rel_margin=2e-3)


# The apple layout returns fp16 logits whatever the recipe (Apple's engines read fp16 only):
# rounding a logit to fp16 moves it by up to 2^-11 of its magnitude (4.9e-4 of the scale at
# most). Measured on the three tiny presets: 3-4e-4 of scale over 20 tokens.
FP16_LOGITS_GATE = GateThresholds(max_rel_logit_delta=1e-3, tie_rel_margin=1e-3)


def gate_thresholds(recipe: Recipe, state_dtype: str, logits_dtype: str = "float32") -> GateThresholds:
    """The recipe's thresholds, widened to the fp16-state budget when the state is fp16 and to
    the fp16-logits budget when the bundle returns fp16 logits of an fp32 recipe."""
    widen = [t for t, on in ((FP16_STATE_GATE, state_dtype == "float16"),
                             (FP16_LOGITS_GATE, logits_dtype == "float16")) if on]  # fmt: skip
    gate = recipe.gate
    for extra in widen:
        gate = GateThresholds(
            max_rel_logit_delta=max(gate.max_rel_logit_delta, extra.max_rel_logit_delta),
            tie_rel_margin=max(gate.tie_rel_margin, extra.tie_rel_margin),
            min_top1=min(gate.min_top1, extra.min_top1),
        )
    return gate


def get_recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise SsmportError(f"unknown --quant {name!r}; choose one of: {', '.join(RECIPES)}")
    return RECIPES[name]
