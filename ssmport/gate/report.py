"""Teacher-forced parity gate.

The same fixed token streams go, one token at a time from zeroed state, through the fp32
torch reference and through the candidate (the exported graph on the Core AI runtime). Per
step we compare top-1 and |Δlogits|. Teacher forcing matters: a free-running comparison
forks its whole tail at the first near-tie and reports false mismatches.

When the candidate has a chunked prefill function (`has_prefill`), the first half of each
stream goes in through it, as a prompt would: one record compares the logits after that
prompt, then the rest is teacher-forced one token at a time through the decode function,
from the state prefill left. That tests both functions and the hand-over between them.

A top-1 disagreement is excused only where the reference's own top-2 margin is below the
recipe's `tie_rel_margin` times that step's logit scale (the model itself barely prefers one
token); excused steps are counted separately and shown.
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


@dataclass
class GateReport:
    recipe: str
    thresholds: dict
    prompts: list[list[int]]
    steps: list[StepRecord] = field(default_factory=list)
    logit_scale: float = 1.0
    synthetic: bool = False

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
    def worst(self) -> StepRecord | None:
        return max(self.steps, key=lambda s: s.max_abs_delta, default=None)

    @property
    def passed(self) -> bool:
        t = GateThresholds(**self.thresholds)
        ok_top1 = (self.count("agree") + self.count("tie")) >= t.min_top1 * self.n
        return self.n > 0 and ok_top1 and self.max_rel_delta <= t.max_rel_logit_delta

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
        }

    def to_json(self) -> dict:
        return {"summary": self.summary(), "prompts": self.prompts, "steps": [asdict(s) for s in self.steps]}

    def headline(self) -> str:
        s = self.summary()
        verdict = "PASS" if self.passed else "FAIL"
        ties = f" (+{s['top1_excused_ties']} near-tie)" if s["top1_excused_ties"] else ""
        return (
            f"{verdict} {self.recipe}: top-1 {s['top1_agree']}/{self.n}{ties}, "
            f"max |Δlogits| {s['max_abs_logit_delta']:.3g} ({s['max_rel_logit_delta']:.2e} of scale "
            f"{s['logit_scale']:.3g}; limit {self.thresholds['max_rel_logit_delta']:.2g})"
            + (" [synthetic weights]" if self.synthetic else "")
        )


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
) -> GateReport:
    report = GateReport(recipe, asdict(thresholds), [list(p) for p in prompts], synthetic=synthetic)
    scale = 1.0

    def compare(p: int, t: int, token: int, ref: np.ndarray, got: np.ndarray, via: str) -> None:
        nonlocal scale
        ref, got = ref.astype(np.float64), got.astype(np.float64)
        step_scale = max(1.0, float(np.abs(ref).max()))
        scale = max(scale, step_scale)
        ref_top, got_top = int(np.argmax(ref)), int(np.argmax(got))
        margin = top2_margin(ref)
        if ref_top == got_top:
            status = "agree"
        elif margin < thresholds.tie_rel_margin * step_scale:
            status = "tie"
        else:
            status = "mismatch"
        delta = float(np.abs(ref - got).max())
        report.steps.append(StepRecord(p, t, int(token), ref_top, got_top, margin, delta, status, via))

    for p, tokens in enumerate(prompts):
        candidate.reset()
        reference.reset()
        start = len(tokens) // 2 if getattr(candidate, "has_prefill", False) else 0
        if start:
            prompt = list(tokens[:start])
            compare(p, start - 1, prompt[-1], reference.feed(prompt), candidate.feed(prompt), "prefill")
            for _ in prompt:
                if on_step:
                    on_step()
        for t in range(start, len(tokens)):
            compare(p, t, tokens[t], reference.step(tokens[t]), candidate.step(tokens[t]), "main")
            if on_step:
                on_step()
    report.logit_scale = scale
    return report


def default_prompts(vocab_size: int, count: int, length: int, seed: int = 0, tokenizer=None) -> list[list[int]]:
    """Fixed token streams: built-in texts when a tokenizer is at hand, else seeded ids."""
    if tokenizer is not None:
        streams = [tokenizer.encode(DEFAULT_TEXTS[i % len(DEFAULT_TEXTS)]) for i in range(count)]
        streams = [(s * (length // max(len(s), 1) + 1))[:length] for s in streams]
        return streams
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab_size, size=length).tolist() for _ in range(count)]
