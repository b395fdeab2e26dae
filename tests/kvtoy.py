"""kvtoy: a tiny hybrid written for the tests, on ssmport's generic graph and ops layer.

Layers "attn", "rnn", "attn": two causal GQA attention layers with rotary positions, whose
K/V live in the positional states keyCache / valueCache [2, 1, kv_heads, context, head_dim]
(kind "kv"), around a gated diagonal RNN layer with a fixed state h [1, 1, width]. The plain
reference loop keeps K/V as python lists and uses only naive ops, so the graph's cache writes,
its masking, its chunked prefill and its state plumbing are all checked against it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

import ssmport
from ssmport.loader.checkpoint import DictSource
from ssmport.graph import Embedding, NormHead, Step
from ssmport.models.layers import KEY_CACHE, VALUE_CACHE
from ssmport.models.layers.attention import AttentionMixer, AttentionNames, AttentionSpec
from ssmport.ops import attention
from ssmport.ops.norms import rms_norm_naive
from ssmport.ops.scan import scan
from ssmport.state import KV, StateSpec

PATTERN = ("attn", "rnn", "attn")
THETA = 10000.0


@dataclass(frozen=True)
class KVToyConfig:
    vocab_size: int = 96
    width: int = 32
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 12  # heads * head_dim != width: a square shape cannot hide a mix-up
    context: int = 48

    def to_json(self):
        return asdict(self)


def shapes(c: KVToyConfig) -> dict[str, tuple[int, ...]]:
    s = {"emb": (c.vocab_size, c.width), "norm": (c.width,), "out": (c.vocab_size, c.width)}
    for i, kind in enumerate(PATTERN):
        if kind == "attn":
            s |= {f"l{i}.q": (c.heads * c.head_dim, c.width), f"l{i}.k": (c.kv_heads * c.head_dim, c.width),
                  f"l{i}.v": (c.kv_heads * c.head_dim, c.width), f"l{i}.o": (c.width, c.heads * c.head_dim)}
        else:
            s |= {f"l{i}.w": (c.width, c.width), f"l{i}.decay": (c.width,)}
    return s


class Attention(nn.Module):
    """x + attention(x): the shared AttentionMixer (GQA, full RoPE), no norm around it."""

    states = (KEY_CACHE, VALUE_CACHE)

    def __init__(self, c: KVToyConfig, i: int, src, b):
        super().__init__()
        spec = AttentionSpec(c.heads, c.kv_heads, c.head_dim, rotary_dim=c.head_dim, rope_theta=THETA)
        self.mixer = AttentionMixer(spec, AttentionNames(*(f"l{i}.{n}" for n in "qkvo")), src, b)

    def forward(self, x, slices, step: Step):
        out, kv = self.mixer(x, slices, step)
        return x + out, kv


class RNN(nn.Module):
    states = ("h",)

    def __init__(self, c: KVToyConfig, i: int, src, b):
        super().__init__()
        self.w = b.matmul(f"l{i}.w", src[f"l{i}.w"].t(), "state_proj")
        self.decay = b.vector(f"l{i}.decay", src[f"l{i}.decay"], "mix")

    def forward(self, x, slices, step: Step):
        a, u = torch.sigmoid(self.decay), torch.tanh(self.w(x))  # [C], [T, C]
        h0 = slices["h"].float().view(1, 1, -1)
        if step.decode:
            h = a * h0 + (1 - a) * u
            return x + h.view(1, -1), {"h": h}

        def rnn_step(h, u_t):
            h = a * h + (1 - a) * u_t
            return h, h

        h_last, hs = scan(rnn_step, h0, (u.view(-1, 1, u.shape[-1]),), step.valid_len, (1, u.shape[-1]), keep_row_dim=True)
        return x + hs.view(x.shape), {"h": h_last}


class KVToyReference:
    def __init__(self, c: KVToyConfig, weights):
        self.c, self.w = c, {n: weights[n].float() for n in shapes(c)}

    def zero_state(self):
        return {"K": {i: [] for i, k in enumerate(PATTERN) if k == "attn"},
                "V": {i: [] for i, k in enumerate(PATTERN) if k == "attn"}, "h": torch.zeros(self.c.width)}

    def step(self, token: int, state) -> torch.Tensor:
        c, w = self.c, self.w
        x = w["emb"][token]
        pos = torch.tensor([len(state["K"][0])])
        for i, kind in enumerate(PATTERN):
            if kind == "attn":
                rope = lambda t, heads: attention.apply_rotary_naive(t.view(1, heads, c.head_dim), pos, c.head_dim, THETA)[0]  # noqa: E731
                q, k = rope(w[f"l{i}.q"] @ x, c.heads), rope(w[f"l{i}.k"] @ x, c.kv_heads)
                v = (w[f"l{i}.v"] @ x).view(c.kv_heads, c.head_dim)
                past_k = torch.stack(state["K"][i]) if state["K"][i] else torch.zeros(0, c.kv_heads, c.head_dim)
                past_v = torch.stack(state["V"][i]) if state["V"][i] else torch.zeros(0, c.kv_heads, c.head_dim)
                x = x + w[f"l{i}.o"] @ attention.naive(q, k, v, past_k, past_v).reshape(-1)
                state["K"][i].append(k)
                state["V"][i].append(v)
            else:
                a = torch.sigmoid(w[f"l{i}.decay"])
                state["h"] = a * state["h"] + (1 - a) * torch.tanh(w[f"l{i}.w"] @ x)
                x = x + state["h"]
        return w["out"] @ rms_norm_naive(x, w["norm"], 1e-6)


def toy_weights(shapes: dict[str, tuple[int, ...]], seed: int) -> DictSource:
    """Random weights: "norm" gains near 1, matrices scaled by 1/sqrt(fan-in), vectors unit."""
    g = torch.Generator().manual_seed(seed)
    return DictSource({n: (1 + 0.1 * torch.randn(s, generator=g)) if n == "norm" else
                       torch.randn(s, generator=g) / (math.sqrt(s[-1]) if len(s) == 2 else 1)
                       for n, s in shapes.items()})  # fmt: skip


def toy_embedding(src, b) -> Embedding:
    return Embedding(b.table("emb", src["emb"], "embedding"))


def toy_head(src, b) -> NormHead:
    """The final RMSNorm ("norm") and the head ("out")."""
    return NormHead(b.matmul("out", src["out"].t(), "head", out_dtype=b.recipe.logits_dtype),
                    b.vector("norm", src["norm"], "norm"), 1e-6)  # fmt: skip


class KVToy(ssmport.Architecture):
    def config_from_json(self, data):
        return KVToyConfig(**data)

    def synthetic_weights(self, c, seed):
        return toy_weights(shapes(c), seed)

    def state_specs(self, c, state_dtype):
        cache = (2, 1, c.kv_heads, c.context, c.head_dim)
        axes = "[attention layer, batch, kv head, position, head_dim]"
        return [StateSpec("keyCache", cache, state_dtype, axes, KV), StateSpec("valueCache", cache, state_dtype, axes, KV),
                StateSpec("h", (1, 1, c.width), state_dtype, "[rnn layer, batch, width]")]  # fmt: skip

    def build_blocks(self, c, src, b):
        blocks = [Attention(c, i, src, b) if kind == "attn" else RNN(c, i, src, b) for i, kind in enumerate(PATTERN)]
        return toy_embedding(src, b), blocks, toy_head(src, b)

    def reference(self, c, weights):
        return KVToyReference(c, weights)

    def keeps_float(self, name):
        return name != "out"


KVTOY = KVToy(name="kvtoy", description="test-only hybrid: attention with a KV cache + a diagonal RNN",
              presets=(ssmport.Preset("kvtoy-tiny", "kvtoy", asdict(KVToyConfig()), "test model", released=False),),
              tiny_preset="kvtoy-tiny")  # fmt: skip
