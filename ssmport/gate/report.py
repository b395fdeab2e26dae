"""Teacher-forced parity gate.

The same fixed token streams go, one token at a time from zeroed state, through the fp32
torch reference and through the candidate (the exported graph on the Core AI runtime). Per
step we compare top-1 and |Δlogits|. Teacher forcing matters: a free-running comparison
forks its whole tail at the first near-tie and reports false mismatches.

When the candidate has a chunked prefill function (`has_prefill`), the first half of each
stream goes in through it, as a prompt would: one record compares the logits after that
prompt, then the rest is teacher-forced one token at a time through the decode function,
from the state prefill left. That tests both functions and the hand-over between them. (A
candidate loaded without it, as a 16-bit bundle's export gate is, records the bundle's prefill
function in `not_run`: ssmport.gate.run.)

A top-1 disagreement is excused only where the reference's own top-2 margin is below the
recipe's `tie_rel_margin` times that step's logit scale (the model itself barely prefers one
token); excused steps are counted separately and shown.

A recipe whose thresholds carry a `floor_factor` (fp32) is also given the same reference in
float64 (`exact`, ssmport.gate.fp64). Its report then holds three distances per step: the
candidate vs the fp32 reference (as without it), the fp32 reference vs fp64 (the reference's
own rounding: the noise floor, which no bundle can be judged below) and the candidate vs
fp64, which is what the verdict judges: max |Δ| vs fp64 <= max(the recipe's limit,
floor_factor x the floor), top-1 against fp64's, a flip excused where fp64's margin is below
max(the recipe's tie margin, floor_factor x the floor). The floor comes from the reference's
weights alone, never from the candidate, so it cannot grow with an error in the bundle.

A 16-bit recipe (`runtime_floor_factor`) has a floor of its own: what the fp32 reference moves
when its weights run in fp16 with this runtime's fp16 sums (`runtime_floor_abs`, computed in
torch by ssmport.gate.run). The verdict judges the candidate against the fp32 reference with
max |Δ| <= max(the recipe's limit, runtime_floor_factor x that floor), the same rule for flips,
and, where the recipe's own error was measured (`recipe_split`: its stored weights with fp32
sums), that error within the recipe's limit: the floor excuses this runtime's arithmetic, not
the recipe's rounding. The candidate's distance from its twin (the recipe with this runtime's
sums: what the bundle should compute, `twin`) is recorded per step and shown.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

from ssmport.quant.recipes import GateThresholds

MAX_GATE_TOKENS = 100_000  # teacher-forced steps in one gate: ~minutes on a small model, bounded memory
DEFAULT_TEXTS = (
    "The capital of France is Paris. It is known for the Eiffel Tower, museums, and cafés.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(10)])",
    "User: 你好，请介绍一下你自己。\n\nAssistant: 我是一个语言模型，可以回答问题。",
)


class Steppable(Protocol):
    def reset(self) -> None: ...

    def step(self, token: int) -> np.ndarray: ...

    def feed(self, tokens: list[int]) -> np.ndarray: ...  # logits after the last token


@dataclass
class StepRecord:
    prompt: int
    step: int
    token: int
    ref_top1: int
    got_top1: int
    ref_margin: float
    max_abs_delta: float
    status: str  # "agree" | "tie" (excused near-tie) | "mismatch"
    via: str = "main"  # "prefill": the logits after tokens [0, step] fed as one prompt
    # With an fp64 reference (floor gates): candidate vs fp64, fp32 reference vs fp64, fp64's top-1 and margin.
    exact_abs_delta: float | None = None
    floor_abs_delta: float | None = None
    exact_top1: int | None = None
    exact_margin: float | None = None
    twin_abs_delta: float | None = None  # 16-bit: candidate vs the recipe with this runtime's sums


@dataclass
class GateReport:
    recipe: str
    thresholds: dict
    prompts: list[list[int]]
    steps: list[StepRecord] = field(default_factory=list)
    logit_scale: float = 1.0
    synthetic: bool = False
    # How long each reference took (gate_bundle): in memory only, so that two exports of one
    # model write the same gate.json and manifest (tests/test_reproducible.py).
    reference_seconds: dict = field(default_factory=dict)
    recipe_split: dict | None = None  # 16-bit recipes: the recipe's own error apart from this runtime's (set_recipe_split)
    not_run: list[str] = field(default_factory=list)  # the bundle's functions the run left out ("prefill": gate_bundle)
    runtime_floor_abs: float | None = None  # 16-bit: max |the reference in fp16 with this runtime's sums - it|

    @property
    def n(self) -> int:
        return len(self.steps)

    def count(self, status: str) -> int:
        return sum(s.status == status for s in self.steps)

    @property
    def max_abs_delta(self) -> float:
        return max((s.max_abs_delta for s in self.steps), default=0.0)

    @property
    def max_rel_delta(self) -> float:
        return self.max_abs_delta / self.logit_scale

    @property
    def has_floor(self) -> bool:
        """Whether the run had an fp64 reference (then the verdict judges against it)."""
        return self.n > 0 and all(s.exact_abs_delta is not None for s in self.steps)

    def judged_delta(self, s: StepRecord) -> float:
        """The step's |Δ| the verdict reads: vs fp64 when the run had it, else vs the reference."""
        return s.exact_abs_delta if self.has_floor else s.max_abs_delta

    @property
    def floor_abs(self) -> float:
        """max |fp32 reference - fp64 reference| over the run (0 without an fp64 reference)."""
        return max((s.floor_abs_delta or 0.0 for s in self.steps), default=0.0)

    @property
    def floor_excuse_abs(self) -> float:
        """The factor x the floor (fp64's, or this runtime's 16-bit one) the verdict allows, absolute."""
        t = GateThresholds(**self.thresholds)
        if self.has_floor:
            return (t.floor_factor or 0.0) * self.floor_abs
        return (t.runtime_floor_factor or 0.0) * (self.runtime_floor_abs or 0.0)

    @property
    def limit(self) -> float:
        """The max |Δ| / scale the verdict allows: the recipe's, or the factor x the floor."""
        return max(GateThresholds(**self.thresholds).max_rel_logit_delta, self.floor_excuse_abs / self.logit_scale)

    @property
    def recipe_within_limit(self) -> bool:
        """Whether the recipe's own error (fp32 sums), where measured, is within its fixed limit."""
        split = self.recipe_split
        return split is None or split["recipe_vs_reference_rel"] <= self.thresholds["max_rel_logit_delta"]

    @property
    def worst(self) -> StepRecord | None:
        return max(self.steps, key=self.judged_delta, default=None)

    @property
    def passed(self) -> bool:
        t = GateThresholds(**self.thresholds)
        ok_top1 = (self.count("agree") + self.count("tie")) >= t.min_top1 * self.n
        worst = max(map(self.judged_delta, self.steps), default=0.0)
        return self.n > 0 and ok_top1 and worst / self.logit_scale <= self.limit and self.recipe_within_limit

    def noise_floor(self) -> dict | None:
        """The three distances and the limit they give (None without an fp64 reference)."""
        if not self.has_floor:
            return None
        exact = max(s.exact_abs_delta for s in self.steps)
        return {
            "reference_vs_fp64_abs": self.floor_abs,
            "reference_vs_fp64_rel": self.floor_abs / self.logit_scale,
            "bundle_vs_fp64_abs": exact,
            "bundle_vs_fp64_rel": exact / self.logit_scale,
            "bundle_vs_reference_rel": self.max_rel_delta,
            "factor": self.thresholds.get("floor_factor"),
            "limit_rel": self.limit,
        }

    def runtime_floor(self) -> dict | None:
        """The 16-bit floor, the limit it gives and the candidate's distance from its twin (None without it)."""
        if self.runtime_floor_abs is None:
            return None
        twin = [s.twin_abs_delta for s in self.steps if s.twin_abs_delta is not None]
        return {
            "reference_in_fp16_vs_reference_abs": self.runtime_floor_abs,
            "reference_in_fp16_vs_reference_rel": self.runtime_floor_abs / self.logit_scale,
            "factor": self.thresholds.get("runtime_floor_factor"),
            "limit_rel": self.limit,
            "bundle_vs_twin_abs": max(twin) if twin else None,
            "bundle_vs_twin_rel": max(twin) / self.logit_scale if twin else None,
        }

    def summary(self) -> dict:
        w = self.worst
        return {
            "passed": self.passed,
            "recipe": self.recipe,
            "synthetic_weights": self.synthetic,
            "steps": self.n,
            "prompts": len(self.prompts),
            "top1_agree": self.count("agree"),
            "top1_excused_ties": self.count("tie"),
            "top1_mismatch": self.count("mismatch"),
            "max_abs_logit_delta": self.max_abs_delta,
            "max_rel_logit_delta": self.max_rel_delta,
            "logit_scale": self.logit_scale,
            "worst_step": None if w is None else {"prompt": w.prompt, "step": w.step, "token": w.token},
            "thresholds": self.thresholds,
            "noise_floor": self.noise_floor(),
            "recipe_split": self.recipe_split,
            "runtime_floor": self.runtime_floor(),
            "functions": sorted({s.via for s in self.steps}),
            "functions_not_run": self.not_run,
        }

    def to_json(self) -> dict:
        return {"summary": self.summary(), "prompts": self.prompts, "steps": [asdict(s) for s in self.steps]}

    def headline(self) -> str:
        s = self.summary()
        verdict = "PASS" if self.passed else "FAIL"
        ties = f" (+{s['top1_excused_ties']} near-tie)" if s["top1_excused_ties"] else ""
        fixed = self.thresholds["max_rel_logit_delta"]
        f = s["noise_floor"]
        r = s["runtime_floor"]
        if f is None and r is not None:
            delta = (f"max |Δlogits| {s['max_abs_logit_delta']:.3g} ({s['max_rel_logit_delta']:.2e} of scale "
                     f"{s['logit_scale']:.3g}; limit {r['limit_rel']:.2g} = max({fixed:.2g}, {r['factor'] or 0:g} x the "
                     f"reference's floor in fp16 with this runtime's sums {r['reference_in_fp16_vs_reference_rel']:.2e}))")  # fmt: skip
        elif f is None:
            delta = (f"max |Δlogits| {s['max_abs_logit_delta']:.3g} ({s['max_rel_logit_delta']:.2e} of scale "
                     f"{s['logit_scale']:.3g}; limit {fixed:.2g})")  # fmt: skip
        else:
            delta = (f"max |Δlogits| vs fp64 {f['bundle_vs_fp64_abs']:.3g} ({f['bundle_vs_fp64_rel']:.2e} of scale "
                     f"{s['logit_scale']:.3g}; limit {f['limit_rel']:.2g} = max({fixed:.2g}, {f['factor'] or 0:g} x the "
                     f"fp32 reference's floor {f['reference_vs_fp64_rel']:.2e})); vs the fp32 reference "
                     f"{s['max_rel_logit_delta']:.2e} of scale")  # fmt: skip
        split = self.recipe_split
        if split is not None:
            over = "" if self.recipe_within_limit else f", OVER its limit {fixed:.2g}"
            delta += (f"; of which the recipe (torch, same stored weights, fp32 sums) "
                      f"{split['recipe_vs_reference_rel']:.2e}{over}, the rest this runtime's sums")  # fmt: skip
        if r is not None and r["bundle_vs_twin_rel"] is not None:
            delta += f"; vs the recipe with this runtime's sums {r['bundle_vs_twin_rel']:.2e}"
        if self.not_run:
            delta += f"; the {' and '.join(self.not_run)} function not run"
        return (f"{verdict} {self.recipe}: top-1 {s['top1_agree']}/{self.n}{ties}, {delta}"
                + (" [synthetic weights]" if self.synthetic else ""))

    def set_recipe_split(self, reference: list[np.ndarray], recipe_only: list[np.ndarray]) -> None:
        """Record how far the recipe's own torch module with fp32 sums (ssmport.gate.accumulation)
        is from the fp32 reference over the same streams: what the recipe costs, next to what the
        bundle measured (the rest is this runtime's 16-bit sums). Shown only; the verdict is not
        changed by it."""
        delta = streams_max_abs_delta(recipe_only, reference)
        agree = sum(int((a.argmax(1) == b.argmax(1)).sum()) for a, b in zip(recipe_only, reference))
        self.recipe_split = {
            "recipe_vs_reference_abs": delta,
            "recipe_vs_reference_rel": delta / self.logit_scale,
            "recipe_top1_agree": agree,
            "tokens": sum(len(a) for a in reference),
            "bundle_vs_reference_rel": self.max_rel_delta,
        }


def streams_max_abs_delta(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """max |a - b| over the logits of every stream (float64 differences)."""
    return max(float(np.abs(x.astype(np.float64) - y).max()) for x, y in zip(a, b))


def top2_margin(logits: np.ndarray) -> float:
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


def run_gate(
    candidate: Steppable,
    reference: Steppable,
    prompts: list[list[int]],
    recipe: str,
    thresholds: GateThresholds,
    synthetic: bool = False,
    on_step=None,
    exact: Steppable | None = None,
    twin: Steppable | None = None,
    runtime_floor_abs: float | None = None,
) -> GateReport:
    """`exact`: the reference in float64, for thresholds with a `floor_factor`; `twin`: the recipe
    with this runtime's sums and `runtime_floor_abs` the 16-bit floor, for thresholds with a
    `runtime_floor_factor` (module docstring)."""
    report = GateReport(recipe, asdict(thresholds), [list(p) for p in prompts], synthetic=synthetic,
                        runtime_floor_abs=runtime_floor_abs)  # fmt: skip
    scales: list[float] = []  # each step's logit scale (of the judging reference)

    def compare(p: int, t: int, token: int, ref: np.ndarray, got: np.ndarray, via: str, ex=None, tw=None) -> None:
        ref, got = ref.astype(np.float64), got.astype(np.float64)
        judge = ref if ex is None else ex.astype(np.float64)
        scales.append(max(1.0, float(np.abs(judge).max())))
        record = StepRecord(p, t, int(token), int(np.argmax(ref)), int(np.argmax(got)), top2_margin(ref),
                            float(np.abs(ref - got).max()), "", via)  # fmt: skip
        if ex is not None:
            record.exact_abs_delta, record.floor_abs_delta = float(np.abs(judge - got).max()), float(np.abs(judge - ref).max())
            record.exact_top1, record.exact_margin = int(np.argmax(judge)), top2_margin(judge)
        if tw is not None:
            record.twin_abs_delta = float(np.abs(tw.astype(np.float64) - got).max())
        report.steps.append(record)

    def feed(runner, prompt):
        return None if runner is None else runner.feed(prompt)

    def step(runner, token):
        return None if runner is None else runner.step(token)

    for p, tokens in enumerate(prompts):
        for runner in (candidate, reference, exact, twin):
            if runner is not None:
                runner.reset()
        start = len(tokens) // 2 if getattr(candidate, "has_prefill", False) else 0
        if start:
            prompt = list(tokens[:start])
            compare(p, start - 1, prompt[-1], reference.feed(prompt), candidate.feed(prompt), "prefill",
                    feed(exact, prompt), feed(twin, prompt))  # fmt: skip
            for _ in prompt:
                if on_step:
                    on_step()
        for t in range(start, len(tokens)):
            compare(p, t, tokens[t], reference.step(tokens[t]), candidate.step(tokens[t]), "main", step(exact, tokens[t]),
                    step(twin, tokens[t]))  # fmt: skip
            if on_step:
                on_step()
    report.logit_scale = max(scales, default=1.0)
    _judge_top1(report, thresholds, scales)
    return report


def _judge_top1(report: GateReport, thresholds: GateThresholds, scales: list[float]) -> None:
    """Each step's status: "agree", "tie" (a flip where the judging reference's own top-2 margin
    is below the tie margin) or "mismatch". With an fp64 reference the judge is fp64 and the tie
    margin is at least floor_factor x the fp32 reference's floor (what its own rounding moves);
    with a 16-bit floor, at least runtime_floor_factor x it."""
    floor_tie = report.floor_excuse_abs
    for s, step_scale in zip(report.steps, scales):
        top, margin = (s.exact_top1, s.exact_margin) if report.has_floor else (s.ref_top1, s.ref_margin)
        if top == s.got_top1:
            s.status = "agree"
        elif margin < max(thresholds.tie_rel_margin * step_scale, floor_tie):
            s.status = "tie"
        else:
            s.status = "mismatch"


def default_prompts(vocab_size: int, count: int, length: int, seed: int = 0, tokenizer=None) -> list[list[int]]:
    """Fixed token streams: built-in texts when a tokenizer is at hand, else seeded ids."""
    if tokenizer is not None:
        streams = [tokenizer.encode(DEFAULT_TEXTS[i % len(DEFAULT_TEXTS)]) for i in range(count)]
        streams = [(s * (length // max(len(s), 1) + 1))[:length] for s in streams]
        return streams
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab_size, size=length).tolist() for _ in range(count)]
