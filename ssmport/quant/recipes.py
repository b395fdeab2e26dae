"""Quantization recipes, as data.

A recipe says how each weight is stored. Which weights feed the recurrence (and so stay in
float) is not the recipe's business: each architecture's `keeps_float(name)` predicate
decides that, and `int8keepproj` applies it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ssmport.errors import SsmportError

BLOCK_SIZE = 32  # integer block length along a matmul's input dimension
FLOAT = None  # `Recipe.weight_bits` of a matmul that stays in the recipe's float dtype
# A matmul's stored forms, as the plan names them: (integer width or FLOAT, affine blocks).
STORAGE: dict[str, tuple[int | None, bool]] = {"float16": (FLOAT, False), "int8": (8, False), "int4": (4, False),
                                               "uint4": (4, True)}  # fmt: skip


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
    - `floor_factor`: when set (fp32), the gate also runs the reference in float64 and judges
      the candidate against that, allowing max(`max_rel_logit_delta`, floor_factor x the fp32
      reference's own distance from fp64) (ssmport.gate.report; docs/parity.md).
    - `runtime_floor_factor`: the same for the 16-bit recipes, whose floor is what the fp32
      reference moves when run in fp16 with this runtime's fp16 sums (ssmport.gate.accumulation).
    """

    max_rel_logit_delta: float
    tie_rel_margin: float
    min_top1: float = 1.0
    floor_factor: float | None = None
    runtime_floor_factor: float | None = None


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    float_dtype: torch.dtype  # storage and matmul dtype of float matmul weights and tables
    quantized: str  # which matmuls are integer: "none" | "bulk" (those the architecture does not keep float) | "all"
    gate: GateThresholds
    bits: int = 8  # integer width of the quantized matmuls
    zero_point: bool = False  # affine blocks (a per-block zero point) instead of symmetric ones
    role_bits: tuple[tuple[str, int | None], ...] = ()  # per-role overrides of `bits` (None: float), e.g. (("head", 8),)
    # What integer-block matmuls dequantize to and sum in (None: fp16, the scales' dtype).
    # Float matmuls always compute in their weight's dtype: the converter folds a cast of an
    # fp16 constant into an fp32 constant, doubling its bytes (docs/quantization.md).
    compute_dtype: torch.dtype | None = None
    kept_bits: int | None = FLOAT  # width of the matmuls an architecture keeps float but declares int8-safe
    # `auto`: each matmul's stored form by canonical name ((name, STORAGE key) pairs), chosen by
    # measurement under a size budget (ssmport.quant.auto); a name absent follows the rules above.
    per_tensor: tuple[tuple[str, str], ...] = ()

    # Least integer width of a routed-expert stack (None: as any matmul of its role), unless the
    # architecture measured its experts safe at 4 bits (`Architecture.int4_safe_experts`).
    expert_bits: int | None = None
    # A tied embedding reads the int8 LM head's levels and scales instead of an fp16 table of its
    # own (ssmport.quant.tied), unless the export says otherwise (--no-int8-tied-table). On where
    # trained tied models measured the int8 rows' error small against the recipe's own
    # (benchmarks/tied_int8_fidelity.py; docs/quantization.md "A tied table read from an int8 head").
    int8_tied_table: bool = False

    @property
    def int8_head(self) -> bool:
        """Whether this recipe stores an LM head (one the architecture does not keep float) as
        symmetric int8 blocks: what a tied table can be read from."""
        return not self.per_tensor and not self.zero_point and self.weight_bits(False, "head") == 8

    def storage(self, name: str, role: str, keeps_float: bool, int8_safe: bool = False,
                expert_stack: bool = False, int4_safe_experts: bool = False) -> tuple[int | None, bool]:  # fmt: skip
        """(integer width or FLOAT, affine) of the matmul weight (or expert stack) `name`."""
        chosen = self._chosen(name)
        if chosen is not None:
            return STORAGE[chosen]
        bits = self.weight_bits(keeps_float, role, int8_safe)
        if expert_stack and bits is not FLOAT and self.expert_bits and not int4_safe_experts:
            bits = max(bits, self.expert_bits)
        return bits, self.zero_point

    def table_bits(self, name: str) -> int | None:
        """The integer width of lookup table `name` (symmetric blocks along its width), or FLOAT:
        only an `auto` plan stores a table as integers; every fixed recipe keeps tables float."""
        chosen = self._chosen(name)
        return FLOAT if chosen is None else STORAGE[chosen][0]

    def _chosen(self, name: str) -> str | None:
        """The stored form an `auto` plan chose for tensor `name` (a STORAGE key), else None."""
        return dict(self.per_tensor).get(name) if self.per_tensor else None

    def weight_bits(self, keeps_float: bool, role: str = "", int8_safe: bool = False) -> int | None:
        """The integer width of a matmul weight under this recipe (FLOAT: it stays float), given
        the architecture's verdicts on it (`keeps_float`: it feeds the recurrence, or is
        otherwise sensitive; `int8_safe`: measured harmless at int8 next to a 4-bit bulk) and
        its role."""
        if self.quantized == "none":
            return FLOAT
        if self.quantized == "bulk" and keeps_float:
            return self.kept_bits if int8_safe else FLOAT
        return dict(self.role_bits).get(role, self.bits)

    @property
    def logits_dtype(self) -> torch.dtype:
        return self.float_dtype

    def with_int8_tied_table(self, on: bool | None) -> Recipe:
        """This recipe with an export's choice of where a tied table is read from (None: its own
        default); one line where it cannot apply."""
        if on is None or on == self.int8_tied_table:
            return self
        if on and not self.int8_head:
            raise SsmportError(f"--int8-tied-table reads a tied table from an int8 LM head, which --quant {self.name} "
                               "does not store (int8keepproj, int4keepproj and int8 do)")  # fmt: skip
        return dataclasses.replace(self, int8_tied_table=on)


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
# - int4keepproj, int4: measured by each tiny preset's default gate (8 steps, synthetic
#   weights, Core AI runtime; benchmarks/int4_gates.py) and on the trained rwkv7-pydoc
#   (241 held-out bytes: 0.061 and 0.093 of scale, no flip where the margin > 0.5;
#   benchmarks/accumulation.py). int4keepproj reached 0.0068 (mamba2) .. 0.200 (nemotron-h)
#   with every top-1 agreeing or a near-tie; its limit is 1.5x that largest, the margin
#   int8keepproj's limit has over its own measurement (0.15 vs 0.092). qwen3.5-tiny reached
#   0.50 with a missed top-1 and fails. int4 reached 0.118 .. 0.403 (lfm2) outside qwen3.5
#   (0.96): limit 1.5 x 0.403; it misses top-1s on 5 of 7 presets and fails there. Both take
#   the int8 comparison recipe's near-tie and top-1 rules (errors of the same order).
# - auto: int4keepproj's limits. A budget at or above int4keepproj's size measures at most its
#   error on the calibration stream (auto minimizes that error); a tighter budget lowers more
#   and may fail the gate, which then says so.
# - fp32 at released widths: the fp32 reference itself is further than 1e-4 of scale from exact
#   math (rwkv7-1.5b 1.27e-3 from fp64, rwkv6-1.6b's bundle 5.8e-4 from it), so its gate also
#   runs the reference in fp64 and allows FP32_FLOOR_FACTOR x that floor. The Core AI runtime's
#   fp32 distance from fp64 over torch's: 1.15-1.42 against the fp64 loop; with the gate itself
#   0.35-1.26 at released widths (rwkv6-1.6b 0.54, rwkv7-1.5b 0.35), up to 1.85 on tiny presets
#   whose floor is far below 1e-4 (docs/quantization.md, "The fp32 gate's noise floor";
#   benchmarks/fp32_gate_floor.py). 2 is above every ratio measured.
FP32_FLOOR_FACTOR = 2.0
# - 16-bit recipes at released widths: this runtime sums fp16 matmuls in fp16, and that alone
#   moves the fp32 reference's logits further than a fixed limit allows (qwen3.5-0.8b's fp16
#   bundle 0.154 of scale against 0.06, its recipe in torch with fp32 sums 0.010). The gate runs
#   the reference's weights in fp16 with this runtime's sums emulated in torch (bit-exact on
#   every matmul form, tests/test_gate_accumulation.py) and allows RUNTIME_FLOOR_FACTOR x that
#   floor: a correct fp16 bundle lands at 1x (it is that computation) to the fp32 rounding of
#   the ops between the matmuls (docs/quantization.md, "The 16-bit gates' noise floor").
RUNTIME_FLOOR_FACTOR = 2.0
RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "fp32",
            "Reference: every weight and all compute in fp32.",
            torch.float32,
            "none",
            GateThresholds(max_rel_logit_delta=1e-4, tie_rel_margin=1e-4, floor_factor=FP32_FLOOR_FACTOR),
        ),
        Recipe(
            "fp16",
            "fp16 matmul weights and embedding, fp16 matmuls; residual stream, norms, gates "
            "and the recurrence in fp32 (per-channel vectors stay fp32).",
            torch.float16,
            "none",
            GateThresholds(max_rel_logit_delta=0.06, tie_rel_margin=0.02, runtime_floor_factor=RUNTIME_FLOOR_FACTOR),
        ),
        Recipe(
            "int8keepproj",
            "int8 weights (symmetric, one fp16 scale per 32 inputs) on the weight bulk (FFN, "
            "LM head); projections that feed the recurrence, LoRAs and embeddings stay fp16, "
            "norms and per-channel vectors fp32.",
            torch.float16,
            "bulk",
            GateThresholds(max_rel_logit_delta=0.15, tie_rel_margin=0.02, runtime_floor_factor=RUNTIME_FLOOR_FACTOR),
        ),
        Recipe(
            "int4keepproj",
            "int4 weights (symmetric, one fp16 scale per 32 inputs) on the weight bulk (FFN); "
            "int8 on the LM head and on the output projections into the residual; what feeds the "
            "recurrence and the conv stays 16-bit, or int8 where the architecture measured it safe "
            "(RWKV-7: r/k/v/o, LoRAs); embeddings fp16 (a tied one read from the int8 head), norms and "
            "per-channel vectors fp32.",
            torch.float16,
            "bulk",
            GateThresholds(max_rel_logit_delta=0.3, tie_rel_margin=0.05, min_top1=0.97,
                           runtime_floor_factor=RUNTIME_FLOOR_FACTOR),
            bits=4,
            role_bits=(("head", 8), ("out_proj", 8)),  # head: measured (benchmarks/int4_choices.py)
            kept_bits=8,
            # routed experts at 4 bits flipped confident top-1s on random fixtures (benchmarks/int4_experts.py);
            # an architecture whose trained experts measured safe at 4 bits opts out (LFM2-MoE: trained_moe.py)
            expert_bits=8,
            # the int8 rows moved the held-out error of three trained tied models by at most 1.3e-3 of
            # the logit scale against int4keepproj's own 0.09-0.13 (benchmarks/tied_int8_fidelity.py)
            int8_tied_table=True,
        ),
        Recipe(
            "int8",
            "The same int8 on every matmul, state projections and LoRAs included (for "
            "comparison; int8 on the recurrence inputs flips borderline tokens).",
            torch.float16,
            "all",
            GateThresholds(max_rel_logit_delta=0.3, tie_rel_margin=0.05, min_top1=0.97,
                           runtime_floor_factor=RUNTIME_FLOOR_FACTOR),
        ),
        Recipe(
            "auto",
            "Chosen by measurement under --size-budget: each matmul (and expert stack) fp16, int8 "
            "or int4, the least measured error that fits (int4 with zero points is measured and "
            "shown, not chosen); embeddings fp16, or int8 / int4 rows where the budget needs them (a "
            "tied one read from the int8 head), norms and per-channel vectors fp32.",
            torch.float16,
            "all",  # every matmul may be lowered; Recipe.per_tensor says how far (ssmport.quant.auto)
            GateThresholds(max_rel_logit_delta=0.3, tie_rel_margin=0.05, min_top1=0.97,
                           runtime_floor_factor=RUNTIME_FLOOR_FACTOR),
            bits=4,
        ),
        Recipe(
            "int4",
            "The same symmetric int4 blocks on every matmul, LM head and state projections "
            "included (for comparison).",
            torch.float16,
            "all",
            GateThresholds(max_rel_logit_delta=0.6, tie_rel_margin=0.05, min_top1=0.97,
                           runtime_floor_factor=RUNTIME_FLOOR_FACTOR),
            bits=4,
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
        gate = dataclasses.replace(
            gate,
            max_rel_logit_delta=max(gate.max_rel_logit_delta, extra.max_rel_logit_delta),
            tie_rel_margin=max(gate.tie_rel_margin, extra.tie_rel_margin),
            min_top1=min(gate.min_top1, extra.min_top1),
        )
    return gate


# manifest.export: an export's choice of where a tied table is read from, where it overrode the
# recipe's default (--int8-tied-table / --no-int8-tied-table)
INT8_TIED_TABLE = "int8_tied_table"


def get_recipe(name: str | Recipe) -> Recipe:
    if isinstance(name, Recipe):
        return name
    if name not in RECIPES:
        raise SsmportError(f"unknown --quant {name!r}; choose one of: {', '.join(RECIPES)}")
    return RECIPES[name]


def exported_recipe(name: str, export: dict) -> Recipe:
    """The recipe a bundle was exported with: `name`'s, with the choices its manifest's `export`
    recorded (so a gate rebuilt from the manifest builds the weights the bundle holds)."""
    return get_recipe(name).with_int8_tied_table(export.get(INT8_TIED_TABLE))
