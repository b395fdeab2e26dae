"""Apple's engines' driving protocol, emulated over any model object, call for call.

`SequentialEngine` and `PipelinedEngine` make the calls CoreAISequentialEngine and
CoreAIPipelinedEngine make, at the revision chosen (`sources`): the same functions with the
same ``[1, T]`` token batches and whole-history ``position_ids`` ``[1, processed + T]``,
prompts through ``prefill`` in the engine's chunks with the last token held back for ``main``
(or through ``main`` whole or in chunks, before the prefill graph), the same history
matching and resets (a full reset zeroes states; a partial one only moves the cursor), the
same KV growth (a copy of the leading positions into a buffer twice the size) and greedy
sampling (argmax over the last row of the fp16 logits; on the GPU the pipelined engine's
argmax may break exact ties differently).

The model is anything with ``call(function_name, inputs, states) -> outputs``: numpy arrays,
states mutated in place (an adapter over a real runtime copies the results back into them).
Every call is recorded in ``engine.calls``. An engine refuses a bundle whose `check_engine`
verdict has a ``throws`` guard; ``misdrives`` guards are emulated where they concern the
protocol (rewinds, resets, what is fed), not where they concern buffers (a fixed-size state
taken for a KV cache is held at its own shape here, where the pipelined engine would cap the
context at one of its dimensions).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ssmport.errors import SsmportError

from ssmport.apple.description import BundleDesc, FunctionDesc, TensorDesc
from ssmport.apple.engine_rules import PIPELINED_ENGINE, PREFILL_FUNCTION, SEQUENTIAL_ENGINE, THROWS, Guard, check_engine, input_roles
from ssmport.apple.sources import PRE_HYBRID, PREFILL_GRAPH, REVISIONS
from ssmport.apple.state_kinds import KV_CACHE, classify, has_non_truncatable

PIPELINE_DEPTH = 3  # CoreAIPipelinedEngine.swift:28@86b363d: steps in flight


class Model(Protocol):
    def call(self, function: str, inputs: dict[str, np.ndarray], states: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class EngineError(SsmportError):
    """The engine refused the bundle, or a call broke the contract it relies on."""

    def __init__(self, message: str, guards: Sequence[Guard] = ()):
        super().__init__(message)
        self.guards = tuple(guards)


@dataclass(frozen=True)
class Call:
    function: str
    tokens: tuple[int, ...]
    positions: int  # length of position_ids: tokens processed before this call + len(tokens)


def prefill_chunk_sizes(count: int, chunk: int, held_back: int, balanced: bool = True) -> list[int]:
    """PrefillGraph.prefillChunkSizes: the chunk sizes covering all but ``held_back`` tokens.

    Balanced (as many chunks as ``chunk``-wide ones would take, sizes within one token of
    each other; PrefillGraph.swift:61-69@13e414e) or full-width-then-remainder (the earlier
    form, e.g. in fork pkmandke/coreai-models@2f2bc68).
    """
    width = max(1, chunk)
    total = max(0, count - max(0, held_back))
    if total == 0:
        return []
    if not balanced:
        return [width] * (total // width) + ([total % width] if total % width else [])
    n = -(-total // width)
    base, extra = divmod(total, n)
    return [base + 1 if i < extra else base for i in range(n)]


def common_prefix(history: Sequence[int], tokens: Sequence[int]) -> int:
    """TokenHistory.resolve: how many leading tokens agree (TokenHistory.swift:35-55@86b363d)."""
    n = 0
    for a, b in zip(history, tokens):
        if a != b:
            break
        n += 1
    return n


def prefix_reset_plan(common: int, history: int, processed: int, count: int, non_truncatable: bool) -> int | None:
    """Where the sequential engine rewinds before a generation (None: it does not).

    CoreAISequentialEngine.generate (CoreAISequentialEngine.swift:360-381@86b363d): with a
    fixed state, any rewind is a full reset; otherwise a divergence resets fully and a prompt
    no longer than what was processed rewinds the cursor to one token before the match.
    """
    if non_truncatable:
        return 0 if common < history or processed >= count else None
    if common < count and common < history:
        return 0
    if processed >= count:
        return max(0, common - 1)
    return None


class _States:
    """The engine's state buffers: growing KV caches (dynamic dims sized to a capacity that
    doubles, old positions copied) and fixed states (allocated once, zeroed)."""

    def __init__(self, main: FunctionDesc, kinds: dict[str, str], max_context: int, kv_initial: int, pipelined: bool):
        self.descs = {s.name: s for s in main.states}
        self.kv = [n for n, k in kinds.items() if k == KV_CACHE]
        self.max_context = max_context
        self.pipelined = pipelined
        self.capacity = min(kv_initial, max_context) if self.kv else max_context
        self.arrays = {name: self._allocate(d, self.capacity) for name, d in self.descs.items()}

    @staticmethod
    def _allocate(desc: TensorDesc, capacity: int) -> np.ndarray:
        if desc.dtype not in ("float16", "float32"):
            raise EngineError(f"{desc.name}: the emulator holds float16/float32 states, not {desc.dtype}")
        return np.zeros([capacity if d is None else d for d in desc.shape], dtype=desc.dtype)

    def _seq_dim(self, name: str) -> int:
        desc = self.descs[name]
        if self.pipelined:  # KVCacheFactory.detectSequenceDim (KVCache+CoreAI.swift:104-106@86b363d)
            return 3 if len(desc.shape) == 5 else 2
        first = self.descs[self.kv[0]].shape  # GrowingNDArrayState (StateHandler+NDArray.swift:85@86b363d)
        return next((i for i, d in enumerate(first) if d is None), max(0, len(first) - 2))

    def ensure(self, needed: int) -> None:
        if not self.kv or needed <= self.capacity:
            return
        if needed > self.max_context:
            raise EngineError(f"context length {needed} exceeds maximum {self.max_context}")
        new = max(self.capacity, 1)
        while new < needed:
            new = min(new * 2, self.max_context)
        for name in self.kv:
            old, desc = self.arrays[name], self.descs[name]
            grown = self._allocate(desc, new)
            dim = self._seq_dim(name)
            keep = tuple(slice(0, min(old.shape[i], grown.shape[i])) if i == dim else slice(None) for i in range(old.ndim))
            grown[keep] = old[keep]
            self.arrays[name] = grown
        self.capacity = new

    def zero(self, names: Iterable[str]) -> None:
        for name in names:
            self.arrays[name].fill(0)


class _Engine:
    engine = ""

    def __init__(
        self,
        desc: BundleDesc,
        model: Model,
        *,
        revision: str = PREFILL_GRAPH,
        chunk_threshold: int = 1024,
        balanced_chunks: bool = True,
        kv_initial: int = 256,
    ):
        """``chunk_threshold``: ModelConfig.chunkThreshold (COREAI_CHUNK_THRESHOLD, default 1024);
        the prefill chunk is min(512, threshold) (ModelConfig.swift:131-143@86b363d).
        ``kv_initial``: the KV caches' first capacity (256 in both engines)."""
        if revision not in REVISIONS:
            raise ValueError(f"unknown revision {revision!r}; known: {', '.join(REVISIONS)}")
        verdict = check_engine(desc, self.engine, revision)
        refusals = [g for g in verdict.failures if g.effect == THROWS]
        if refusals:
            raise EngineError(f"{self.engine} ({revision}) refuses the bundle: {refusals[0]}", refusals)
        self.desc, self.model, self.revision = desc, model, revision
        self.vocab_size = int(desc.language["vocab_size"])
        self.max_context = int(desc.language["max_context_length"])
        self.chunk_threshold = chunk_threshold
        self.chunk_size = min(512, chunk_threshold)
        self.balanced_chunks = balanced_chunks
        self.main_name = desc.main_name
        self.main = desc.functions[self.main_name]
        ids, pos = input_roles(self.main, revision)
        self.ids_name, self.pos_name, self.logits_name = ids.name, pos.name, self.main.outputs[0].name
        self.kinds = classify(self.main, revision)
        self.non_truncatable = revision != PRE_HYBRID and has_non_truncatable(self.kinds)
        self.use_prefill = revision == PREFILL_GRAPH and PREFILL_FUNCTION in desc.functions
        self.states = _States(self.main, self.kinds, self.max_context, kv_initial, self.engine == PIPELINED_ENGINE)
        self.processed = 0
        self.history: list[int] = []
        self.calls: list[Call] = []

    # -- model calls ---------------------------------------------------------------------------------

    def _call(self, function: str, tokens: Sequence[int]) -> np.ndarray | None:
        """One call on ``tokens`` at the cursor; the last row of its logits (main) or None."""
        count = len(tokens)
        if self.engine == SEQUENTIAL_ENGINE:
            self.states.ensure(self.processed + count)
        total = self.processed + count
        inputs = {
            self.ids_name: np.asarray(tokens, dtype=np.int32).reshape(1, count),
            self.pos_name: np.arange(total, dtype=np.int32).reshape(1, total),
        }
        outputs = self.model.call(function, inputs, self.states.arrays)
        self.calls.append(Call(function, tuple(int(t) for t in tokens), total))
        self.processed = total
        if function == PREFILL_FUNCTION:
            return None
        logits = outputs[self.logits_name]
        if logits.dtype != np.float16 or logits.shape != (1, count, self.vocab_size):
            raise EngineError(f"{function} returned {self.logits_name} {logits.dtype}{list(logits.shape)}, "
                              f"not float16[1, {count}, {self.vocab_size}]")
        return logits[0, -1]

    def _reset(self) -> None:
        self.processed = 0
        self.history = []


class SequentialEngine(_Engine):
    """CoreAISequentialEngine: ``generate(with:)`` and its iterator, consumed until a stop id."""

    engine = SEQUENTIAL_ENGINE

    def generate(self, input_ids: Sequence[int], *, max_tokens: int | None = None, stop_ids: Iterable[int] = ()) -> list[int]:
        """The ids the engine samples for one request, the first stop id included (after it the
        consumer stops calling ``next()``, so that id is never fed)."""
        tokens = [int(t) for t in input_ids]
        if self.history:
            self._rewind(tokens)
        stops = set(stop_ids)
        limit = min(math.inf if max_tokens is None else max_tokens, max(0, self.max_context - len(tokens)))
        out: list[int] = []
        while len(out) < limit:
            if self.processed >= len(tokens):
                raise EngineError("No new tokens to process")  # CoreAISequentialEngine.swift:620-622@86b363d
            new = tokens[self.processed :]
            logits = self._feed(new)
            self.history.extend(new)
            token = int(np.argmax(logits))
            tokens.append(token)
            out.append(token)
            if token in stops:
                break
        return out

    def _rewind(self, tokens: list[int]) -> None:
        common = common_prefix(self.history, tokens)
        if self.revision == PRE_HYBRID:  # CoreAISequentialEngine.swift:359-369@b66a122
            to = 0 if common < len(tokens) and common < len(self.history) else (
                max(0, common - 1) if self.processed >= len(tokens) else None)
        else:
            to = prefix_reset_plan(common, len(self.history), self.processed, len(tokens), self.non_truncatable)
        if to == 0:
            self._reset()
            self.states.zero(self.states.arrays)  # kvCache.reset(); additionalStates?.reset()
        elif to is not None:
            self.processed = to  # the cursor only: states are not rewound
            del self.history[to:]

    def _feed(self, new: list[int]) -> np.ndarray:
        """The iterator's prefill strategy for the new tokens; the last token's logits."""
        if self.revision != PREFILL_GRAPH:
            # processChunkedPrompt / processTokenBatch (CoreAISequentialEngine.swift:211-320@86b363d)
            if len(new) <= self.chunk_threshold:
                return self._call(self.main_name, new)
            for start in range(0, len(new), self.chunk_size):
                logits = self._call(self.main_name, new[start : start + self.chunk_size])
            return logits
        if not (self.use_prefill or len(new) > self.chunk_threshold):
            return self._call(self.main_name, new)
        # runChunkedPrefill: chunks through `prefill`, the held-back tail through `main`.
        held = 1 if self.use_prefill else 0
        logits, start = None, 0
        for size in prefill_chunk_sizes(len(new), self.chunk_size, held, self.balanced_chunks):
            out = self._call(PREFILL_FUNCTION if self.use_prefill else self.main_name, new[start : start + size])
            logits = out if out is not None else logits
            start += size
        if start < len(new):
            logits = self._call(self.main_name, new[start:])
        return logits


class PipelinedEngine(_Engine):
    """CoreAIPipelinedEngine: ``generate(with:)`` streaming GPU-sampled tokens.

    The engine runs ahead of its consumer: after the consumer has seen a stop id and stopped,
    up to ``overrun`` more steps may already be encoded (each feeds the previous sampled
    token), and ``overrun_seen`` of their tokens reach the history before the stream ends.
    Both depend on GPU timing on device; they are parameters here.
    """

    engine = PIPELINED_ENGINE

    def generate(
        self,
        input_ids: Sequence[int],
        *,
        max_tokens: int | None = None,
        stop_ids: Iterable[int] = (),
        overrun: int = 0,
        overrun_seen: int | None = None,
    ) -> list[int]:
        """The ids the consumer receives, through the first stop id."""
        tokens = [int(t) for t in input_ids]
        if not tokens:
            raise EngineError("empty input")
        if not 0 <= overrun <= PIPELINE_DEPTH:
            raise ValueError(f"overrun must be 0..{PIPELINE_DEPTH}")
        seen = overrun if overrun_seen is None else min(overrun_seen, overrun)
        new = self._resolve(tokens)
        self.history.extend(new)
        produced, stop_at = self._run(new, max_tokens, set(stop_ids), overrun)
        received = produced if stop_at is None else produced[: stop_at + 1]
        self.history.extend(produced if stop_at is None else produced[: stop_at + 1 + seen])
        return received

    def _resolve(self, tokens: list[int]) -> list[int]:
        """generate()'s prefix matching (CoreAIPipelinedEngine.swift:164-203@86b363d)."""
        common = common_prefix(self.history, tokens)
        divergence = common < len(tokens) and common < len(self.history)
        if self.revision == PREFILL_GRAPH and common > self.processed:
            # The last yielded token was never fed: cap to what the KV cache holds.
            common = self.processed
            del self.history[common:]
        if common == len(tokens) and common > 0:
            common -= 1  # at least one token seeds the decode loop
        if divergence or (self.non_truncatable and common < self.processed):
            self._reset()
            self.states.zero(n for n, k in self.kinds.items() if k != KV_CACHE)  # reset(): fixed states only
            return tokens
        if common < self.processed:
            self.processed = common
            del self.history[common:]
        return tokens[common:]

    def _run(self, prompt: list[int], max_tokens: int | None, stops: set[int], overrun: int) -> tuple[list[int], int | None]:
        """runCompletion: prefill, the first token, then decode steps until the budget or the
        consumer's stop lands ``overrun`` steps later."""
        left = self.max_context - self.processed - len(prompt)
        if left < 1:
            raise EngineError(f"context length exceeded ({self.processed} + {len(prompt)} of {self.max_context})")
        total = min(math.inf if max_tokens is None else max_tokens, left)
        self.states.ensure(min(self.processed + len(prompt) + total, self.max_context))
        produced = [int(np.argmax(self._call(self.main_name, self._prefill(prompt))))]
        stop_at = 0 if produced[0] in stops else None
        while len(produced) < total:
            if stop_at is not None and len(produced) - 1 - stop_at >= overrun:
                break  # the consumer's cancellation has landed
            self.states.ensure(self.processed + 1)
            produced.append(int(np.argmax(self._call(self.main_name, produced[-1:]))))
            if stop_at is None and produced[-1] in stops:
                stop_at = len(produced) - 1
        return produced, stop_at

    def _prefill(self, prompt: list[int]) -> list[int]:
        """The prompt chunks that need no logits; returns the tokens left for ``main``."""
        if self.use_prefill:  # prefill(prompt:): all but the last token through `prefill`
            width = max(1, min(self.chunk_size, self.max_context))
            start = 0
            for size in prefill_chunk_sizes(len(prompt), width, 1, self.balanced_chunks):
                self._call(PREFILL_FUNCTION, prompt[start : start + size])
                start += size
            return prompt[-1:]
        threshold, chunk = self.chunk_threshold, self.chunk_size
        ids = next(t for t in self.main.inputs if t.name == self.ids_name)
        if self.revision == PREFILL_GRAPH and ids.shape[1] is not None:  # InputLayout: a static query length
            threshold = chunk = ids.shape[1]
        if len(prompt) <= threshold:
            return prompt
        rest = prompt
        while len(rest) > chunk:  # processChunkedInput (CoreAIPipelinedEngine.swift:1554-1567@86b363d)
            self._call(self.main_name, rest[:chunk])
            rest = rest[chunk:]
        return rest
