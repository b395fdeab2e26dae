"""Tiny deterministic numpy language models over named states, for the Apple engine emulation.

Each toy is a pure function of (token, position, states). A multi-token call loops the
single-token step, so a chunked call equals token-by-token calls bit for bit and the tests
check the engines' bookkeeping, not numerics. Kinds of state:

* recurrent (`recState`, `convState`, ...): a fixed-size summary of the whole prefix;
* KV (`keyCache`, `valueCache`): one row per position along a dynamic dimension; a step at
  position p writes row p and attends to rows 0..p, and never reads beyond
  ``len(position_ids)`` (rows past it are stale after a rewind or a reset).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ssmport.apple.description import BundleDesc, FunctionDesc, TensorDesc
from ssmport.apple.metadata import metadata_json, tokenizer_config_json

VOCAB = 61
WIDTH = 6
IDS = TensorDesc("input_ids", (1, None), "int32")
POS = TensorDesc("position_ids", (1, None), "int32")
LOGITS = TensorDesc("logits", (1, None, VOCAB), "float16")


@dataclass(frozen=True)
class ToyLayout:
    """Which states the toy has: recurrent ones (name -> shape) and whether it has a KV pair."""

    recurrent: tuple[tuple[str, tuple[int, ...]], ...]
    kv: bool = False

    def states(self) -> tuple[TensorDesc, ...]:
        out = []
        if self.kv:
            out += [TensorDesc("keyCache", (1, 1, 1, None, WIDTH), "float32"), TensorDesc("valueCache", (1, 1, 1, None, WIDTH), "float32")]
        out += [TensorDesc(name, shape, "float32") for name, shape in self.recurrent]
        return tuple(out)


RECURRENT_3 = ToyLayout((("recState", (2, 1, WIDTH, WIDTH)), ("attnShiftState", (2, 1, WIDTH)), ("ffnShiftState", (2, 1, WIDTH))))
RECURRENT_2 = ToyLayout((("recState", (2, 1, WIDTH, WIDTH)), ("shiftState", (2, 1, 2, WIDTH))))
HYBRID = ToyLayout((("convStates", (1, 1, 3, WIDTH)), ("recurrentStates", (1, 1, WIDTH, WIDTH))), kv=True)
ATTENTION = ToyLayout((), kv=True)


class ToyModel:
    """``call(function, inputs, states)`` as Apple's engines drive it."""

    def __init__(self, layout: ToyLayout, seed: int = 0):
        self.layout = layout
        rng = np.random.default_rng(seed)
        self.embed = rng.normal(size=(VOCAB, WIDTH))
        self.mix = rng.normal(size=(WIDTH, WIDTH)) / np.sqrt(WIDTH)
        self.qkv = rng.normal(size=(3, WIDTH, WIDTH)) / np.sqrt(WIDTH)
        self.head = rng.normal(size=(WIDTH, VOCAB)) * 2.0
        self.freq = rng.uniform(0.1, 1.0, size=WIDTH)

    def zero_states(self, capacity: int) -> dict[str, np.ndarray]:
        return {s.name: np.zeros([capacity if d is None else d for d in s.shape], dtype=s.dtype) for s in self.layout.states()}

    def step(self, token: int, position: int, states: dict[str, np.ndarray]) -> np.ndarray:
        """One token at ``position``: updates ``states`` in place, returns float16 logits [VOCAB]."""
        x = self.embed[token] + 0.5 * np.sin(position * self.freq)  # positions keep replies from settling
        for name, _ in self.layout.recurrent:
            s = states[name]
            if s.ndim == 4 and s.shape[-1] == s.shape[-2] == WIDTH:  # a matrix state per layer
                for layer in range(s.shape[0]):
                    m = s[layer, 0]
                    m *= 0.85
                    m += 0.15 * np.outer(np.tanh(x), x)
                    x = np.tanh(x + m @ x)
            else:  # a window of past inputs (shift / conv): oldest first
                win = s.reshape(s.shape[0], -1, WIDTH)
                for layer in range(win.shape[0]):
                    prev = win[layer].copy()
                    x = np.tanh(x + 0.7 * prev.mean(axis=0) @ self.mix)
                    win[layer, :-1] = prev[1:]
                    win[layer, -1] = x
                s[...] = win.reshape(s.shape)
        if self.layout.kv:
            q, k, v = (x @ w for w in self.qkv)
            keys, values = states["keyCache"][0, 0, 0], states["valueCache"][0, 0, 0]
            keys[position], values[position] = k, v
            scores = keys[: position + 1] @ q
            weights = np.exp(scores - scores.max())
            x = np.tanh(x + (weights / weights.sum()) @ values[: position + 1])
        # Every recurrent state reaches the logits directly, so any difference in them shows.
        summary = sum(states[name].reshape(-1, WIDTH).sum(axis=0) for name, _ in self.layout.recurrent)
        x = np.tanh(x + 0.3 * summary)
        # A fast-varying readout: nearby states give different tokens, so replies do not settle.
        return np.sin(7.0 * (x @ self.head) + 0.9 * position).astype(np.float16)

    def call(self, function: str, inputs: dict[str, np.ndarray], states: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, positions = inputs["input_ids"][0], inputs["position_ids"][0]
        count, total = len(ids), len(positions)
        # The engines' contract: the whole history 0..total-1, the new tokens at its end.
        assert np.array_equal(positions, np.arange(total)), positions
        if self.layout.kv:
            assert states["keyCache"].shape[3] >= total, (states["keyCache"].shape, total)
        rows = [self.step(int(t), total - count + i, states) for i, t in enumerate(ids)]
        if function == "prefill":
            return {}
        return {"logits": np.stack(rows)[None]}


def reference_generate(model: ToyModel, prompt: list[int], max_new: int, stop: set[int], max_context: int) -> list[int]:
    """The plain loop: fresh zero states, the prompt one token at a time, then greedy
    decoding to the first stop id (included) or ``max_new`` tokens."""
    states = model.zero_states(max_context)
    logits = None
    for i, t in enumerate(prompt):
        logits = model.step(t, i, states)
    out: list[int] = []
    limit = min(max_new, max_context - len(prompt))
    while len(out) < limit:
        token = int(np.argmax(logits))
        out.append(token)
        if token in stop:
            break
        logits = model.step(token, len(prompt) + len(out) - 1, states)
    return out


def toy_bundle(layout: ToyLayout, *, prefill: bool = True, max_context: int = 512, states_metadata: bool = True) -> BundleDesc:
    """The description of a bundle holding the toy, in the layout ssmport recommends."""
    states = layout.states()
    main = FunctionDesc(inputs=(IDS, POS), outputs=(LOGITS,), states=states)
    functions = {"main": main}
    if prefill:
        functions["prefill"] = FunctionDesc(inputs=(IDS, POS), outputs=(), states=states)
    kinds = {s.name: "kv_cache" if s.is_dynamic else "fixed" for s in states}
    meta = metadata_json(name="toy", vocab_size=VOCAB, max_context_length=max_context, tokenizer="ssmport/toy",
                         date="2026-11-01T00:00:00+00:00", states=kinds if states_metadata else None)
    return BundleDesc(
        metadata=meta,
        files=frozenset({"metadata.json", "toy.aimodel", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"}),
        functions=functions,
        tokenizer_config=tokenizer_config_json(eos_token="<eos>", chat_template="{{ messages }}", added_tokens={0: "<eos>"}),
        tokenizer_has_merges=True,
    )
