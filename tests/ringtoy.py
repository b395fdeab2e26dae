"""ringtoy: a tiny model for the tests of the "ring" state kind, on ssmport's generic graph.

Layers "swa", "attn", "swa": two sliding-window GQA attention layers (window 6, rotary
positions) whose K/V live in the ring states slidingKeyCache / slidingValueCache
[2, 1, kv_heads, 6, head_dim], around a full-attention layer over the kv states keyCache /
valueCache [1, 1, kv_heads, context, head_dim]. The window is not a power of two (the slot
arithmetic's float quotient is inexact) and smaller than the tests' prefill chunk (8), so a
chunk wraps the ring. The reference keeps every K/V row in python lists and attends over the
last W with the naive ops.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from kvtoy import toy_embedding, toy_head, toy_weights

import ssmport
from ssmport.graph import Step
from ssmport.models.layers import KEY_CACHE, SLIDING_KEY_CACHE, SLIDING_VALUE_CACHE, VALUE_CACHE
from ssmport.models.layers.attention import attention_step
from ssmport.models.layers.attention import AttentionMixer, AttentionNames, AttentionSpec
from ssmport.ops.norms import rms_norm_naive
from ssmport.state import KV, RING, StateSpec

PATTERN = ("swa", "attn", "swa")


@dataclass(frozen=True)
class RingToyConfig:
    vocab_size: int = 96
    width: int = 32
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 12  # heads * head_dim != width
    window: int = 6
    context: int = 48

    def to_json(self):
        return asdict(self)

    def spec(self, i: int) -> AttentionSpec:
        return AttentionSpec(self.heads, self.kv_heads, self.head_dim, rotary_dim=self.head_dim,
                             window=self.window if PATTERN[i] == "swa" else None)  # fmt: skip


def names(i: int) -> AttentionNames:
    return AttentionNames(*(f"l{i}.{n}" for n in "qkvo"))


def shapes(c: RingToyConfig) -> dict[str, tuple[int, ...]]:
    s = {"emb": (c.vocab_size, c.width), "norm": (c.width,), "out": (c.vocab_size, c.width)}
    for i in range(len(PATTERN)):
        s |= {f"l{i}.q": (c.heads * c.head_dim, c.width), f"l{i}.k": (c.kv_heads * c.head_dim, c.width),
              f"l{i}.v": (c.kv_heads * c.head_dim, c.width), f"l{i}.o": (c.width, c.heads * c.head_dim)}  # fmt: skip
    return s


class Block(torch.nn.Module):
    """x + attention(x): the shared AttentionMixer, over the ring or the kv cache."""

    def __init__(self, c: RingToyConfig, i: int, src, b):
        super().__init__()
        self.mixer = AttentionMixer(c.spec(i), names(i), src, b)
        self.states = self.mixer.states

    def forward(self, x, slices, step: Step):
        out, new = self.mixer(x, slices, step)
        return x + out, new


class RingToyReference:
    def __init__(self, c: RingToyConfig, weights):
        self.c, self.w = c, {n: weights[n].float() for n in shapes(c)}

    def zero_state(self):
        return {"position": 0, "K": {i: [] for i in range(len(PATTERN))}, "V": {i: [] for i in range(len(PATTERN))}}

    def step(self, token: int, state) -> torch.Tensor:
        c, x = self.c, self.w["emb"][token]
        for i in range(len(PATTERN)):
            x = x + attention_step(c.spec(i), names(i).read(self.w), x, state["K"][i], state["V"][i], state["position"])
        state["position"] += 1
        return self.w["out"] @ rms_norm_naive(x, self.w["norm"], 1e-6)


class RingToy(ssmport.Architecture):
    def config_from_json(self, data):
        return RingToyConfig(**data)

    def synthetic_weights(self, c, seed):
        return toy_weights(shapes(c), seed)

    def state_specs(self, c, state_dtype):
        kv, ring = (1, 1, c.kv_heads, c.context, c.head_dim), (2, 1, c.kv_heads, c.window, c.head_dim)
        return [StateSpec(KEY_CACHE, kv, state_dtype, "[attention layer, batch, kv head, position, head_dim]", KV),
                StateSpec(VALUE_CACHE, kv, state_dtype, "[attention layer, batch, kv head, position, head_dim]", KV),
                StateSpec(SLIDING_KEY_CACHE, ring, state_dtype, "[sliding layer, batch, kv head, slot, head_dim]", RING),
                StateSpec(SLIDING_VALUE_CACHE, ring, state_dtype, "[sliding layer, batch, kv head, slot, head_dim]", RING)]  # fmt: skip

    def build_blocks(self, c, src, b):
        return toy_embedding(src, b), [Block(c, i, src, b) for i in range(len(PATTERN))], toy_head(src, b)

    def reference(self, c, weights):
        return RingToyReference(c, weights)

    def keeps_float(self, name):
        return name != "out"

    def apple_state_splits(self, c):
        return []  # its states as they are (the apple layout merges the two rings into one)


RINGTOY = RingToy(name="ringtoy", description="test-only: sliding-window attention over ring states + full attention",
                  presets=(ssmport.Preset("ringtoy-tiny", "ringtoy", asdict(RingToyConfig()), "test model", released=False),),
                  tiny_preset="ringtoy-tiny")  # fmt: skip
