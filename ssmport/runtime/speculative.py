"""Speculative decoding over a bundle's `verify` function, with O(state) rollback.

A round: a drafter (ssmport.drafters) proposes up to k tokens after the context; one call of
the target's `verify` feeds the tokens accepted but not yet fed ("pending", at least one)
followed by the drafts, and returns the logits after each row. Draft i is checked against the
logits of the row before it by the standard rejection scheme (`accept_draft`): kept with
probability min(1, p/q), else replaced by a sample from the normalized residual max(0, p - q)
(q one-hot for a deterministic drafter; at temperature 0 kept iff it is the target's argmax),
which leaves every emitted token distributed exactly as plain sampling from the target. When
every draft holds, the last row gives one more token for free.

Rollback: when a draft is rejected, the runner rewinds its fixed states to the copy taken
before the call (`Runner.mark`, O(fixed state); kv rows are written again before they are
read) and the accepted drafts plus the replacement token become the next round's pending
rows: a rejection costs no extra call. With no drafts and one pending token, the round is one
`main` step, so a drafter with nothing to propose never costs more calls than plain decoding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ssmport.drafters import Draft, Drafter
from ssmport.errors import SsmportError
from ssmport.sampling import sample_next, sampling_probs


@dataclass
class SpeculativeStats:
    """What a generation cost the target: calls of its functions after the prompt was fed."""

    tokens: int = 0  # emitted
    main_calls: int = 0
    verify_calls: int = 0
    drafted: int = 0  # draft tokens the target checked
    accepted: int = 0  # of those, kept

    @property
    def target_calls(self) -> int:
        return self.main_calls + self.verify_calls

    def to_json(self) -> dict:
        calls = self.target_calls
        return asdict(self) | {
            "target_calls": calls,
            "acceptance": round(self.accepted / self.drafted, 4) if self.drafted else None,
            "tokens_per_target_call": round(self.tokens / calls, 4) if calls else None,
        }


def accept_draft(logits: np.ndarray, draft: int, q: np.ndarray | None, temperature: float, top_p: float,
                 rng: np.random.Generator) -> tuple[bool, int]:  # fmt: skip
    """One step of speculative sampling: (whether the target keeps `draft`, the token emitted
    here: the draft, or a draw from the residual). `q` None: a deterministic draft."""
    if temperature == 0:
        best = int(np.argmax(logits))
        return best == draft, best
    p = sampling_probs(logits, temperature, top_p)
    q_draft = 1.0 if q is None else float(q[draft])
    if rng.random() * q_draft < p[draft]:  # u < p/q, without dividing
        return True, draft
    residual = p.copy()
    if q is None:
        residual[draft] = 0.0
    else:
        residual = np.maximum(residual - q, 0.0)
    total = residual.sum()
    if total <= 0:  # p <= q everywhere up to rounding (then a rejection had probability ~0)
        return True, draft
    return False, int(rng.choice(len(p), p=residual / total))


NO_DRAFT = Draft([])


def require_verify(runner) -> None:
    if runner.verify_rows is None:
        raise SsmportError(f"{runner.bundle.path}: this bundle has no verify function, which speculative decoding "
                           "needs; re-export it with --verify K")  # fmt: skip


class SpeculativeDecoder:
    """Decode on `runner` (a bundle with `verify`) with drafts from `drafter`, `k` tokens a
    call at most (default: the bundle's verify width)."""

    def __init__(self, runner, drafter: Drafter | None, k: int | None = None):
        if drafter is None:  # plain decoding, one `main` call a token, with the same statistics
            k = 1
        else:
            require_verify(runner)
            rows = runner.verify_rows
            if k is not None and not 2 <= k <= rows:
                raise SsmportError(f"--draft-tokens {k}: this bundle's verify function checks 2 to {rows} tokens a call")
            k = k or rows
        self.runner, self.drafter, self.k = runner, drafter, k
        self.stats = SpeculativeStats()
        self._start: tuple | None = None  # the runner's mark when decoding began (see settle)
        self._start_count = 0
        self._emitted: list[int] = []
        self._pending: list[int] = []

    def generate(self, prompt: Sequence[int], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int = 0, stop: set[int] | None = None) -> Iterator[int]:  # fmt: skip
        """Feed the prompt, then yield up to `max_tokens` ids, as `Runner.generate` does
        (afterwards the runner holds the prompt and every id but a stop id)."""
        if not prompt:
            raise SsmportError("generation needs at least one prompt token")
        logits = self.runner.feed(list(prompt))
        tokens = self.decode(logits, max_tokens, temperature, top_p, np.random.default_rng(seed), stop)
        yield from tokens
        ended = bool(stop and self._emitted and self._emitted[-1] in stop)  # a stop id is never fed
        self.settle(self._emitted[: len(self._emitted) - ended])

    def decode(self, logits: np.ndarray, max_tokens: int, temperature: float, top_p: float,
               rng: np.random.Generator, stop: set[int] | None = None) -> Iterator[int]:  # fmt: skip
        """Yield up to `max_tokens` ids after the runner's state, whose next-token logits are
        `logits`; stops after a `stop` id. Afterwards the runner holds a prefix of the ids
        (`settle` brings it to exactly the ones wanted)."""
        r = self.runner
        self._start, self._start_count = r.mark(), len(r.tokens)
        self._emitted, self._pending = [], []
        if max_tokens <= 0:
            return
        first = sample_next(logits, temperature, top_p, rng)
        self._emit(first)
        yield first
        if stop and first in stop:
            return
        self._pending = [first]
        while len(self._emitted) < max_tokens:
            left = max_tokens - len(self._emitted)
            room = min(self.k - len(self._pending), left - 1, self._positions_left())
            context = r.tokens + self._pending
            draft = self.drafter.propose(context, room, temperature, top_p, rng) if room > 0 else NO_DRAFT
            new, done = self._round(draft, temperature, top_p, rng, left, stop)
            yield from new
            if done:
                return

    def _positions_left(self) -> int:
        """Draft rows the context still holds beside the pending ones (a bundle without kv
        states: no bound), so a draft never costs a call that plain decoding would not make."""
        r = self.runner
        if r.context is None:
            return self.k
        return r.context - len(r.tokens) - len(self._pending)

    def _round(self, draft: Draft, temperature, top_p, rng, left: int, stop) -> tuple[list[int], bool]:
        """One target call over pending + drafts; the ids it emits and whether decoding ends."""
        r, pending = self.runner, self._pending
        rows_in = pending + list(draft.tokens)
        mark = None
        if len(rows_in) == 1:
            rows = r.step(rows_in[0])[None]
            self.stats.main_calls += 1
        else:
            mark = r.mark()
            rows = r.verify(rows_in)
            self.stats.verify_calls += 1
        base, new, held = len(pending) - 1, [], 0
        for i, d in enumerate(draft.tokens):
            q = None if draft.probs is None else draft.probs[i]
            kept, token = accept_draft(rows[base + i], d, q, temperature, top_p, rng)
            self.stats.drafted += 1
            self.stats.accepted += kept
            new.append(token)
            if not kept:
                break
            held += 1
        else:
            new.append(sample_next(rows[-1], temperature, top_p, rng))  # every draft held: one more
        cut = min(len(new), left)
        if stop:
            cut = min(cut, next((i + 1 for i, t in enumerate(new) if t in stop), cut))
        new = new[:cut]
        for t in new:
            self._emit(t)
        done = len(new) >= left or bool(stop and new and new[-1] in stop)
        # The runner holds pending + every draft; the context is pending + the new ids.
        if held == len(draft.tokens) and len(new) >= held:
            self._pending = new[held:]
        else:
            if mark is not None:
                r.rewind(mark)
            self._pending = pending + new
        return new, done

    def _emit(self, token: int) -> None:
        self._emitted.append(token)
        self.stats.tokens += 1

    def settle(self, keep: Sequence[int]) -> None:
        """Leave the runner holding what it held when decoding began plus `keep` (a prefix
        of the emitted ids): fed where it lacks them, rewound where it holds more."""
        r, keep = self.runner, [int(t) for t in keep]
        held = r.tokens[self._start_count :]
        if held != keep[: len(held)]:
            r.rewind(self._start)
            held = []
        self._feed(keep[len(held) :])
        self._pending = []

    def _feed(self, tokens: list[int]) -> None:
        r = self.runner
        while tokens:
            piece, tokens = tokens[: self.k], tokens[self.k :]
            if len(piece) == 1:
                r.step(piece[0])
                self.stats.main_calls += 1
            else:
                r.verify(piece)
                self.stats.verify_calls += 1


@contextlib.contextmanager
def speculative_decoder(runner, draft: str | None, k: int | None = None) -> Iterator[SpeculativeDecoder]:
    """The decoder `--draft` asks for (None: plain decoding, counted alike), closing a draft
    bundle's runner afterwards."""
    from ssmport.drafters import open_drafter

    if draft is not None:
        require_verify(runner)  # before a draft bundle is loaded
    drafter, draft_runner = open_drafter(draft, runner) if draft is not None else (None, None)
    try:
        yield SpeculativeDecoder(runner, drafter, k)
    finally:
        if draft_runner is not None:
            draft_runner.close()


__all__ = ["SpeculativeDecoder", "SpeculativeStats", "accept_draft", "speculative_decoder"]
