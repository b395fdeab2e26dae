"""Drafters for speculative decoding: cheap guesses of the next tokens, which the target
bundle's `verify` function then checks (ssmport.runtime.speculative).

A drafter proposes up to k tokens after a context; each comes with the distribution q it was
drawn from, or none when the drafter is deterministic (q one-hot on the proposed token), which
is what the rejection scheme needs to keep the target's distribution.

- `LookupDrafter` (prompt lookup): the tokens that followed the most recent earlier occurrence
  of the context's last n tokens (n from `longest` down to `shortest`), else the context's most
  frequent token. No model: strong where text repeats itself (code, documents, chat that
  quotes itself).
- `BundleDrafter`: a smaller bundle with the same tokenizer, decoding k tokens on its own
  runner, rewound to the accepted context each round (its fixed states only: `Runner.mark`).
- `MTPDrafter`: the checkpoint's own multi-token-prediction head (Qwen3.5's `mtp.*`), the
  target bundle's `draft` function (ssmport.models.qwen3_5.mtp), fed the target's hidden states.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from ssmport.errors import SsmportError
from ssmport.sampling import sampling_probs

LOOKUP = "lookup"  # `--draft lookup`
MTP = "mtp"  # the target bundle's own draft head (Qwen3.5's multi-token prediction)
LOOKUP_LONGEST, LOOKUP_SHORTEST = 4, 1  # n-gram lengths tried, longest first
BACKOFF_BREAK_EVEN = 1 / 3  # acceptance at which a one-token verify round costs what it saves
MTP_PRIOR_RUN = 3  # drafts the head is taken to keep a round before any is scored
# A draft model catches up with fewer tokens one by one through `main` than a padded prefill chunk costs.
STEP_CATCH_UP = 4


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    # q of each token (float64 [V]) when drawn at random; None: deterministic (q one-hot)
    probs: list[np.ndarray] | None = None


def _choose(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator, probs: list) -> int:
    """A model drafter's next token: the argmax at temperature 0, else drawn from q (the
    sampling distribution, appended to `probs` for the rejection scheme)."""
    if temperature == 0:
        return int(np.argmax(logits))
    q = sampling_probs(logits, temperature, top_p)
    probs.append(q)
    return int(rng.choice(len(q), p=q))


class Drafter(Protocol):
    def propose(self, context: Sequence[int], k: int, temperature: float, top_p: float,
                rng: np.random.Generator) -> Draft: ...  # fmt: skip


class LookupDrafter:
    """Prompt lookup: n-gram drafts from the context itself (deterministic), backing off to the
    context's most frequent token when no suffix of it recurs."""

    def __init__(self, longest: int = LOOKUP_LONGEST, shortest: int = LOOKUP_SHORTEST):
        self.longest, self.shortest = longest, shortest
        self.backoff_hits = self.backoff_tries = 0
        self._pending: tuple[int, int] | None = None  # (position, token) of the last back-off draft

    def propose(self, context: Sequence[int], k: int, temperature: float = 0.0, top_p: float = 1.0,
                rng: np.random.Generator | None = None) -> Draft:  # fmt: skip
        ctx = np.asarray(context, dtype=np.int64)
        self._score_backoff(ctx)
        for n in range(min(self.longest, len(ctx) - 1), self.shortest - 1, -1):
            tail = ctx[-n:]
            # every start s < len - n whose n tokens equal the tail; the most recent wins
            windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if len(hits):
                # the most recent match that has k tokens after it, else the one with the most
                # (a match just before the tail has only a token or two to offer)
                full = hits[hits + n + k <= len(ctx)]
                start = int(full[-1] if len(full) else hits[0]) + n
                return Draft([int(t) for t in ctx[start : start + k]])
        if k <= 0 or not len(ctx) or not self._backoff_pays():
            return Draft([])
        # No suffix recurs (the last token is new here): back off to order 0, the context's most
        # frequent token (ties: the most recent), which any continuation is likeliest to hold.
        counts = np.bincount(ctx)
        common = np.flatnonzero(counts == counts.max())
        token = int(ctx[np.flatnonzero(np.isin(ctx, common))[-1]])
        self._pending = (len(ctx), token)
        return Draft([token])

    def _score_backoff(self, ctx: np.ndarray) -> None:
        """Whether the last back-off draft held: the context now reaches past its position (a
        context that does not was reset or rewound: the draft is forgotten)."""
        if self._pending is not None:
            position, token = self._pending
            self._pending = None
            if len(ctx) > position:
                self.backoff_tries += 1
                self.backoff_hits += int(ctx[position] == token)

    def _backoff_pays(self) -> bool:
        """A one-token draft turns a `main` call into a `verify` call, which dispatches 1.3-1.45x
        the kernels (benchmarks/README.md, "Speculative decoding") and yields 1 + p tokens: it
        pays while p, the back-off's acceptance (Laplace estimate), is at least BACKOFF_BREAK_EVEN.
        Text that never repeats stops paying for it after two misses."""
        return (self.backoff_hits + 1) / (self.backoff_tries + 2) >= BACKOFF_BREAK_EVEN


class BundleDrafter:
    """A smaller bundle's own greedy (temperature 0) or sampled drafts."""

    def __init__(self, runner):
        self.runner = runner
        self._mark = None  # the draft runner's state at the accepted context of the last round

    def propose(self, context: Sequence[int], k: int, temperature: float, top_p: float,
                rng: np.random.Generator) -> Draft:  # fmt: skip
        r = self.runner
        if self._mark is not None:
            r.rewind(self._mark)  # drop last round's drafts
        held = len(r.tokens)
        if held >= len(context) or list(context[:held]) != r.tokens:
            r.reset()
            held = 0
        new = [int(t) for t in context[held:]]
        logits = r.step_each(new)[-1] if len(new) <= STEP_CATCH_UP or not r.has_prefill else r.feed(new)
        self._mark = r.mark()
        tokens, probs = [], []
        for i in range(k):
            tokens.append(_choose(logits, temperature, top_p, rng, probs))
            if i + 1 < k:
                logits = r.step(tokens[-1])
        return Draft(tokens, probs if temperature > 0 else None)


class MTPDrafter:
    """Drafts from the target bundle's own head (its `draft` function, Runner.draft).

    Head row t is (token t+1, the target's hidden state at t) at position t and predicts token
    t+2. Each round the head first catches up, from the target's true hidden states
    (Runner.hiddens), on the rows the context has and it has not seen: rows up to n-2 for an
    n-token context, whose hidden states the target has computed (positions it holds, and the
    accepted rows of a rejected verify call, which a rewind leaves in Runner.hiddens); the
    last row's logits give the first draft. Each further draft is one single-row call fed the
    head's own output hidden state. Those rows are rewritten from true hidden states on the
    next catch-up before anything reads them (the head's attention reads positions up to a
    row's own), so the head's cache needs no rollback."""

    def __init__(self, runner, adaptive: bool = True):
        """`adaptive` False: draft the whole room every round (tests: every round checked)."""
        self.runner, self.adaptive = runner, adaptive
        self._seen: list[int] = []  # the tokens behind the rows caught up from true hidden states
        self.head_calls = 0
        self.rounds = self.first_hits = self.held = 0  # scored drafts: rounds, first draft kept, drafts kept
        self._last: tuple[int, list[int]] | None = None  # (position, tokens) of the last draft

    def propose(self, context: Sequence[int], k: int, temperature: float, top_p: float,
                rng: np.random.Generator) -> Draft:  # fmt: skip
        r, n = self.runner, len(context)
        self._score(context)
        if self.adaptive:
            k = min(k, self._length())
        if k <= 0 or n < 2:
            return Draft([])
        # rows 0..done-1 hold (token t+1, true hidden t) of this very context
        done = 0
        for a, b in zip(self._seen, context):
            if a != b:
                break
            done += 1
        done = min(max(0, done - 1), n - 2)  # the last row is always (re)computed: its logits are the draft's
        R = r.draft_rows
        for start in range(done, n - 1, R):
            stop = min(start + R, n - 1)
            logits, hidden = r.draft([int(t) for t in context[start + 1 : stop + 1]], r.hiddens[start:stop], start)
            self.head_calls += 1
        self._seen = [int(t) for t in context]
        tokens, probs = [], []
        self._last = (n, tokens)
        for i in range(k):
            tokens.append(_choose(logits[-1], temperature, top_p, rng, probs))
            if i + 1 < k:
                logits, hidden = r.draft([tokens[-1]], hidden[-1:], n - 1 + i)
                self.head_calls += 1
        return Draft(tokens, probs if temperature > 0 else None)

    def _score(self, context: Sequence[int]) -> None:
        """How many of the last draft's tokens the context now holds (a context that does not
        reach past them was rewound or reset: the draft is forgotten)."""
        if self._last is None:
            return
        position, tokens = self._last
        self._last = None
        if len(context) <= position:
            return
        run = 0
        while run < len(tokens) and position + run < len(context) and context[position + run] == tokens[run]:
            run += 1
        self.rounds += 1
        self.first_hits += run > 0
        self.held += run

    def _length(self) -> int:
        """The drafts worth a round. None (a `main` step instead of a `verify` call, 1.3-1.45x the
        kernels) while the first draft's acceptance estimate (prior 2/3, worth three rounds)
        is below BACKOFF_BREAK_EVEN; else one more than the drafts a round has kept on average
        (prior: MTP_PRIOR_RUN), since drafts past the first rejection cost head calls and rows
        and yield nothing."""
        if (self.first_hits + 2) / (self.rounds + 3) < BACKOFF_BREAK_EVEN:
            return 0
        return 1 + math.ceil((self.held + MTP_PRIOR_RUN) / (self.rounds + 1))


def open_drafter(spec: str, target):
    """`--draft lookup`, `--draft mtp` (the target bundle's own draft head) or `--draft BUNDLE`
    (a bundle with the target's tokenizer); `target`: the target's Runner -> (drafter, the
    draft runner to close, or None)."""
    if spec == LOOKUP:
        return LookupDrafter(), None
    if spec == MTP:
        if target.draft_rows is None:
            raise SsmportError(f"--draft mtp: {target.bundle.path} has no draft head; export a checkpoint that ships "
                               "one (Qwen3.5's mtp.*) with --verify K, in the default layout")  # fmt: skip
        return MTPDrafter(target), None
    target_bundle = target.bundle
    from ssmport.bundle import Bundle
    from ssmport.runtime.runner import Runner

    if not Path(spec).exists():
        raise SsmportError(f"--draft {spec}: not 'lookup', not 'mtp' and no such bundle")
    draft = Bundle.open(spec)
    check_same_tokenizer(target_bundle.manifest, draft.manifest, spec)
    return BundleDrafter(runner := Runner(draft)), runner


def check_same_tokenizer(target, draft, where: str) -> None:
    """A draft bundle must speak the target's ids: the same tokenizer file and vocabulary."""
    t, d = target.tokenizer, draft.tokenizer
    if t is None or d is None or t.sha256 != d.sha256:
        raise SsmportError(f"--draft {where}: its tokenizer differs from the target's "
                           f"({d.sha256[:12] if d else 'none'} vs {t.sha256[:12] if t else 'none'}); a draft "
                           "bundle must share the target's tokenizer")  # fmt: skip
    if target.vocab_size != draft.vocab_size:
        raise SsmportError(f"--draft {where}: its vocabulary has {draft.vocab_size:,} ids, the target's "
                           f"{target.vocab_size:,}; a draft bundle must share the target's")  # fmt: skip


__all__ = ["LOOKUP", "MTP", "BundleDrafter", "Draft", "Drafter", "LookupDrafter", "MTPDrafter", "check_same_tokenizer",
           "open_drafter"]
