"""Multi-turn chat over a runner, reusing the state across turns.

A `ChatSession` keeps a snapshot at every turn boundary and, for each new prompt, feeds only
what the state does not already hold:

- the prompt extends what the runner holds: feed the new tokens;
- otherwise: restore the longest snapshot whose tokens are a proper prefix of the prompt
  (proper: at least one token is fed, which gives the logits to sample from), feed the rest;
- no snapshot fits: start from the zero state.

Generation stops exactly at EOS or at a stop string, and the state is left holding exactly
the reply text the user was shown: EOS and the token that completes a stop string are never
fed, and tokens fed while the reply's tail could still begin a stop string are rolled back
from a snapshot when it does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ssmport.errors import SsmportError
from ssmport.runtime.snapshot import StateSnapshot
from ssmport.runtime.snapshot_cache import SnapshotCache, is_prefix
from ssmport.sampling import sample_next

if TYPE_CHECKING:
    from ssmport.bundle import Bundle


@dataclass(frozen=True)
class ChatTemplate:
    """How turns are written as text, and where a reply ends."""

    first_user: str  # "{message}" is replaced by the user's text
    next_user: str  # the same for later turns (it carries the separator after a reply)
    stop_strings: tuple[str, ...]
    eos_ids: tuple[int, ...]
    continues: str | None = None  # why the text is continued instead (no chat format): said once

    def user_turn(self, message: str, first: bool) -> str:
        return (self.first_user if first else self.next_user).replace("{message}", message)


# RWKV World chat format: "User: ...\n\nAssistant: ...\n\nUser: ...". A reply ends at a blank
# line or at end-of-text (id 0); the blank line after a reply is written by the next turn.
RWKV_WORLD_CHAT = ChatTemplate(
    first_user="User: {message}\n\nAssistant:",
    next_user="\n\nUser: {message}\n\nAssistant:",
    stop_strings=("\n\n",),
    eos_ids=(0,),
)
CHAT_TEMPLATES = {"rwkv-world": RWKV_WORLD_CHAT}  # fixed formats, by the bundle's tokenizer kind


def chat_template(bundle: Bundle, tokenizer=None) -> ChatTemplate:
    """The bundle's chat format: the fixed one of its tokenizer kind (RWKV World), else the
    Jinja template its checkpoint shipped (tokenizer_config.json, copied into the bundle at
    export; ssmport.tokenizers.chat_template), whose stop tokens need the bundle's `tokenizer`."""
    from ssmport.loader.pretrained import bundled_model_of

    m = bundle.manifest
    kind = m.tokenizer.kind if m.tokenizer else None
    shipped = bundled_model_of(m.source)
    if shipped is not None and not shipped.chat:  # rwkv7-pydoc: the World format would end every reply at once
        return _continuation(tokenizer, f"{shipped.preset} was trained on plain text, not on a chat format")
    if kind in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[kind]
    if m.tokenizer is not None and m.tokenizer.chat_template is not None and tokenizer is not None:
        from ssmport.tokenizers.chat_template import chat_turns

        first, later, stops = chat_turns(bundle.path / Path(m.tokenizer.chat_template).parent, tokenizer)
        return ChatTemplate(first_user=first, next_user=later, stop_strings=(), eos_ids=stops)
    return _continuation(tokenizer, f"{m.name} has no chat template (its checkpoint shipped none)")


def _continuation(tokenizer, why: str) -> ChatTemplate:
    """No chat format: each line is appended to the text so far and the model continues it."""
    eos = tuple(getattr(tokenizer, "eos_ids", ()) or ())
    return ChatTemplate("{message}", "{message}", (), eos, continues=f"{why}: it continues your text")


@dataclass
class TurnStats:
    prompt_tokens: int = 0
    reused_tokens: int = 0  # already in the state (no compute)
    fed_tokens: int = 0  # prompt tokens computed this turn
    restored: bool = False  # rewound to a snapshot
    reply_tokens: int = 0
    stopped_by: str = ""  # "eos" | "stop string" | "max tokens"
    target_calls: int = 0  # with drafts: calls of the target's functions for the reply
    accepted: str = ""  # with drafts: "accepted/drafted"


@dataclass
class _Reply:
    """Bookkeeping of one reply while it is generated (see `ChatSession.generate`)."""

    tokens: list[int] = field(default_factory=list)  # fed, and shown
    pending: list[int] = field(default_factory=list)  # fed, not yet shown: may begin a stop
    rollback: StateSnapshot | None = None  # the state before the first pending token


class ChatSession:
    """A conversation over a runner (`step`, `feed`, `snapshot`, `restore`, `reset`)."""

    def __init__(self, runner, tokenizer, template: ChatTemplate, cache: SnapshotCache | None = None, decoder=None):
        self.runner = runner
        # a SpeculativeDecoder with a drafter (`chat --draft`): replies through the target's verify calls
        self.decoder = decoder if decoder is not None and decoder.drafter is not None else None
        self.tokenizer = tokenizer
        self.template = template
        self.cache = cache or SnapshotCache()
        self.transcript: list[int] = []  # the conversation so far, as fed
        self.last = TurnStats()

    # -- turns ----------------------------------------------------------------------------
    def send(self, message: str, max_tokens: int = 256, **sampling) -> Iterator[str]:
        """Add a user turn and stream the reply's text."""
        if not message.strip():
            raise SsmportError("empty message")
        prompt = self.transcript + self.tokenizer.encode(self.template.user_turn(message, not self.transcript))
        return self.generate(prompt, max_tokens, **sampling)

    def reset(self) -> None:
        """Start a new conversation (snapshots are kept: an old prefix can still be reused)."""
        self.transcript = []

    # -- the engine -------------------------------------------------------------------------
    def generate(
        self, prompt: Sequence[int], max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0
    ) -> Iterator[str]:
        """Bring the state to `prompt` with as little compute as the snapshots allow, then
        sample a reply, streaming its text. Afterwards `transcript` is the prompt plus the
        reply as fed, and the runner's state holds exactly that."""
        if not prompt:
            raise SsmportError("empty prompt: nothing to condition on")
        prompt = list(prompt)
        logits = self.prefill_to(prompt)
        self.cache.put(self.runner.snapshot())  # turn boundary: the prompt is in
        rng = np.random.default_rng(seed)
        if self.decoder is not None:
            yield from self._drafted_reply(prompt, logits, max_tokens, temperature, top_p, rng)
            return
        reply, shown = _Reply(), self.tokenizer.stream()
        stops = [s.encode() for s in self.template.stop_strings]
        self.last.stopped_by = "max tokens"
        for _ in range(max_tokens):
            token = sample_next(logits, temperature, top_p, rng)
            if token in self.template.eos_ids or self.tokenizer.token_bytes(token) is None:
                self.last.stopped_by = "eos"  # (an id with no text cannot be shown: it ends the reply too)
                break
            text = self.tokenizer.decode(reply.tokens + reply.pending + [token])
            cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                yield from self._end_at_stop(reply, text[:cut], shown)
                self.last.stopped_by = "stop string"
                break
            if reply.rollback is None and _partial_stop(text, stops):
                reply.rollback = self.runner.snapshot()
            logits = self.runner.step(token)
            reply.pending.append(token)
            if not _partial_stop(text, stops):
                yield from self._show(reply, reply.pending, shown)
                reply.pending, reply.rollback = [], None
        yield from self._show(reply, reply.pending, shown)  # fed, and no stop string followed
        yield shown.flush()
        self.transcript = prompt + reply.tokens
        self.last.reply_tokens = len(reply.tokens)
        self.cache.put(self.runner.snapshot())  # turn boundary: the reply is in

    def _drafted_reply(self, prompt: list[int], logits, max_tokens: int, temperature: float, top_p: float,
                       rng) -> Iterator[str]:  # fmt: skip
        """`generate`'s reply through the speculative decoder: the same stops, and the state
        settled on the reply text shown (the decoder feeds ahead, so it is settled at the end,
        not rolled back token by token)."""
        d = self.decoder
        before = (d.stats.target_calls, d.stats.accepted, d.stats.drafted)
        reply, shown = _Reply(), self.tokenizer.stream()
        stops = [s.encode() for s in self.template.stop_strings]
        self.last.stopped_by = "max tokens"
        for token in d.decode(logits, max_tokens, temperature, top_p, rng, set(self.template.eos_ids)):
            if token in self.template.eos_ids or self.tokenizer.token_bytes(token) is None:
                self.last.stopped_by = "eos"
                break
            text = self.tokenizer.decode(reply.tokens + reply.pending + [token])
            cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                tail = text[:cut][len(self.tokenizer.decode(reply.tokens)) :]
                reply.pending = []
                yield from self._show(reply, self.tokenizer.encode(tail) if tail else [], shown)
                self.last.stopped_by = "stop string"
                break
            reply.pending.append(token)
            if not _partial_stop(text, stops):
                yield from self._show(reply, reply.pending, shown)
                reply.pending = []
        yield from self._show(reply, reply.pending, shown)
        d.settle(reply.tokens)
        yield shown.flush()
        self.transcript = prompt + reply.tokens
        self.last.reply_tokens = len(reply.tokens)
        self.last.target_calls = d.stats.target_calls - before[0]
        self.last.accepted = f"{d.stats.accepted - before[1]}/{d.stats.drafted - before[2]}"
        self.cache.put(self.runner.snapshot())

    def prefill_to(self, prompt: list[int]) -> np.ndarray:
        """Bring the state to `prompt` (reusing what it holds, or a snapshot); return the
        logits after the prompt's last token."""
        held = self.runner.tokens
        self.last = TurnStats(prompt_tokens=len(prompt))
        if not (len(held) < len(prompt) and is_prefix(held, prompt)):
            snap = self.cache.longest_proper_prefix(prompt)
            if snap is not None:
                self.runner.restore(snap)
                self.last.restored = True
            else:
                self.runner.reset()
        start = len(self.runner.tokens)
        self.last.reused_tokens, self.last.fed_tokens = start, len(prompt) - start
        return self.runner.feed(prompt[start:])

    def _end_at_stop(self, reply: _Reply, visible: bytes, shown) -> Iterator[str]:
        """The reply ends where a stop string begins: roll back what was fed past that
        point and feed the visible part of a token that straddles it."""
        if reply.rollback is not None:
            self.runner.restore(reply.rollback)
        kept = self.tokenizer.decode(reply.tokens)
        tail = visible[len(kept) :]
        tail_ids = self.tokenizer.encode(tail) if tail else []
        if tail_ids:
            self.runner.feed(tail_ids)
        reply.pending, reply.rollback = [], None
        yield from self._show(reply, tail_ids, shown)

    @staticmethod
    def _show(reply: _Reply, ids: list[int], shown) -> Iterator[str]:
        for t in ids:
            reply.tokens.append(t)
            yield shown.feed(t)


def _partial_stop(text: bytes, stops: list[bytes]) -> bool:
    """Whether `text` ends with a proper, non-empty prefix of a stop string."""
    return any(text.endswith(s[:k]) for s in stops for k in range(1, len(s)))
