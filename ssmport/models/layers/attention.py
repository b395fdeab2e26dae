"""Softmax attention over a KV cache or a sliding-window ring (the variants Qwen3.5, OLMo-Hybrid,
LFM2/LFM3, Granite-4.0-H, Nemotron-H, Falcon-H1 and RecurrentGemma use): the spec, the weight
names and checkpoint shapes, the export-form mixer, and one token of it as the references write it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import KVRows, RingRows, Step
from ssmport.models.layers import KEY_CACHE, SLIDING_KEY_CACHE, SLIDING_VALUE_CACHE, VALUE_CACHE
from ssmport.ops import attention, sliding
from ssmport.ops.norms import rms_norm, rms_norm_naive
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role


@dataclass(frozen=True)
class AttentionSpec:
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int = 0  # 0: no positional encoding ("nope"); else rotate-half RoPE on the first dims
    rope_theta: float = 10000.0
    qk_norm: str | None = None  # None | "rms" (x̂·w) | "rms_offset" (x̂·(1+w), Qwen3.5's zero-centred norm)
    qk_norm_per_head: bool = True  # False: one RMSNorm over all heads' q (and all of k) at once (OLMo-2/3)
    norm_eps: float = 1e-6
    output_gate: bool = False  # Qwen3.5: q_proj gives [query | gate] per head; o *= sigmoid(gate)
    scale: float | None = None  # None: head_dim^-0.5 (Granite: attention_multiplier)
    bias: bool = False  # biases on q/k/v/o
    window: int | None = None  # a sliding window of this many positions (itself included), over a ring
    rope_proportional: bool = False  # the rotary pairs span the head (transformers' "proportional" RoPE)
    head_gate: bool = False  # LFM3: head h's output *= sigmoid(gate_proj(h))[h], a [heads, C] projection

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class AttentionNames:
    """Canonical weight names of one attention layer (norm / bias names None where absent)."""

    q: str
    k: str
    v: str
    o: str
    q_norm: str | None = None
    k_norm: str | None = None
    gate: str | None = None  # the per-head gate's projection (AttentionSpec.head_gate)
    q_bias: str | None = None
    k_bias: str | None = None
    v_bias: str | None = None
    o_bias: str | None = None

    def read(self, weights) -> dict[str, torch.Tensor]:
        """These tensors of `weights` by field ("q", "k", ..., "q_norm", "o_bias"): what the
        references' attention step takes."""
        return {field: weights[name] for field, name in asdict(self).items() if name}


def attention_names(prefix: str, out: str = "o_proj", norm: str | None = None, bias: bool = False,
                    gate: str | None = None) -> AttentionNames:  # fmt: skip
    """transformers' names of one attention layer under `prefix`: {q,k,v}_proj and `out`, the
    per-head norms {q,k}_{norm} where there are any, the projections' biases with `bias`, the
    per-head gate's projection `gate` where there is one."""
    q, k, v, o = f"{prefix}q_proj", f"{prefix}k_proj", f"{prefix}v_proj", prefix + out
    norms = {"q_norm": f"{prefix}q_{norm}.weight", "k_norm": f"{prefix}k_{norm}.weight"} if norm else {}
    biases = {"q_bias": q + ".bias", "k_bias": k + ".bias", "v_bias": v + ".bias", "o_bias": o + ".bias"} if bias else {}
    gates = {"gate": f"{prefix}{gate}.weight"} if gate else {}
    return AttentionNames(q + ".weight", k + ".weight", v + ".weight", o + ".weight", **norms, **gates, **biases)


def attention_shapes(spec: AttentionSpec, names: AttentionNames, hidden: int) -> dict[str, tuple[int, ...]]:
    """The checkpoint shapes of one attention layer (nn.Linear [out, in]); with the output gate
    q_proj also holds the gate's rows."""
    q, kv = spec.q_size * (2 if spec.output_gate else 1), spec.kv_size
    shapes = {names.q: (q, hidden), names.k: (kv, hidden), names.v: (kv, hidden), names.o: (hidden, spec.q_size)}
    if names.q_norm:
        per_head = spec.qk_norm_per_head
        shapes |= {names.q_norm: (spec.head_dim if per_head else spec.q_size,),
                   names.k_norm: (spec.head_dim if per_head else spec.kv_size,)}  # fmt: skip
    if names.q_bias:
        shapes |= {names.q_bias: (q,), names.k_bias: (kv,), names.v_bias: (kv,), names.o_bias: (hidden,)}
    if names.gate:
        shapes[names.gate] = (spec.heads, hidden)
    return shapes


def norm_gain(weight: torch.Tensor, kind: str | None) -> torch.Tensor:
    """The gain an RMSNorm multiplies by: w, or 1+w for a zero-centred norm (computed once at
    build, the same fp32 sum transformers computes on every call)."""
    return 1.0 + weight.float() if kind == "rms_offset" else weight.float()


class AttentionMixer(nn.Module):
    """Causal GQA attention over the layer's slices of keyCache / valueCache.

    q, k and v (and the output gate) come from one fused matmul; the q/k norms (per head or over all heads),
    RoPE, the gate and the scale are the spec's. The new K (after norm and RoPE) and V rows go
    back to the graph as KVRows, written at the tokens' positions; with a sliding window, over
    the ring states instead, as RingRows (ssmport.ops.sliding)."""

    def __init__(self, spec: AttentionSpec, names: AttentionNames, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.spec, s = spec, spec
        self.states = (SLIDING_KEY_CACHE, SLIDING_VALUE_CACHE) if s.window else (KEY_CACHE, VALUE_CACHE)
        q, gate = self._query_and_gate(src[names.q].float())
        rows = [q, src[names.k].float(), src[names.v].float()] + ([gate] if gate is not None else [])
        rows += [src[names.gate].float()] if s.head_gate else []
        self.split = [r.shape[0] for r in rows]  # q | k | v (| gate) (| head gate)
        fused = (names.q, names.k, names.v) + ((names.gate,) if s.head_gate else ())
        self.qkv = b.matmul("{" + ",".join(fused) + "}", torch.cat(rows).t(), Role.ATTN_PROJ)
        del rows, q, gate
        if s.bias:
            q_bias, gate_bias = self._query_and_gate(src[names.q_bias].float())
            bias = torch.cat([q_bias, src[names.k_bias], src[names.v_bias]] + ([gate_bias] if gate_bias is not None else [])
                             + ([torch.zeros(s.heads)] if s.head_gate else []))  # the head gate has no bias
            self.qkv_bias = b.vector("{" + ",".join((names.q_bias, names.k_bias, names.v_bias)) + "}", bias, Role.ATTN_PROJ)
            self.o_bias = b.vector(names.o_bias, src[names.o_bias], Role.ATTN_PROJ)
        self.o = b.matmul(names.o, src[names.o].t(), Role.ATTN_PROJ)
        if s.qk_norm:
            self.q_norm = b.vector(names.q_norm, norm_gain(src[names.q_norm], s.qk_norm), Role.NORM)
            self.k_norm = b.vector(names.k_norm, norm_gain(src[names.k_norm], s.qk_norm), Role.NORM)
        if s.rotary_dim:  # graph constants (not buffers: the states are the only buffers)
            self.inv_freq = attention.rotary_frequencies(s.head_dim, s.rotary_dim, s.rope_theta, s.rope_proportional)
            self.pairs = (s.head_dim if s.rope_proportional else s.rotary_dim) // 2  # dims i, i + pairs turn together
            self.rotate = attention.rotate_half_matrix(s.head_dim, 2 * self.pairs)

    def _query_and_gate(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q_proj's rows (or bias) as (query, gate): with the output gate they are interleaved
        per head, [query (hd) | gate (hd)] (transformers views them [heads, 2*hd] and chunks)."""
        s = self.spec
        if not s.output_gate:
            return rows, None
        both = rows.reshape(s.heads, 2, s.head_dim, -1)
        return both[:, 0].reshape(s.q_size, *rows.shape[1:]), both[:, 1].reshape(s.q_size, *rows.shape[1:])

    def forward(self, h: torch.Tensor, slices: dict, step: Step):
        s, T = self.spec, h.shape[0]
        qkv = self.qkv(h)
        if s.bias:
            qkv = qkv + self.qkv_bias
        parts = qkv.split(self.split, dim=-1)
        q, k, v = parts[0], parts[1], parts[2]
        if s.qk_norm and not s.qk_norm_per_head:
            q, k = rms_norm(q, self.q_norm, s.norm_eps), rms_norm(k, self.k_norm, s.norm_eps)
        q, k = q.view(T, s.heads, s.head_dim), k.view(T, s.kv_heads, s.head_dim)
        if s.qk_norm and s.qk_norm_per_head:
            q, k = rms_norm(q, self.q_norm, s.norm_eps), rms_norm(k, self.k_norm, s.norm_eps)
        if s.rotary_dim:
            q, k = attention.rotate(q, k, step.positions, self.inv_freq, self.rotate, self.pairs)
        v = v.view(T, s.kv_heads, s.head_dim)
        keys, values = self.states
        K, V = slices[keys].float(), slices[values].float()
        scale = s.scale if s.scale is not None else s.head_dim**-0.5
        # a ring may hold fewer slots than its window (a growing ring, ssmport.growing_kv): the
        # slot arithmetic takes the window itself
        ops, window = (sliding, {"window": s.window}) if s.window else (attention, {})
        if step.decode:
            o = ops.decode(q.view(s.heads, -1), k.view(s.kv_heads, -1), v.view(s.kv_heads, -1), K, V,
                           step.positions, scale, **window).view(1, s.q_size)  # fmt: skip
        else:
            o = ops.chunk(q, k, v, K, V, step.positions[0:1], scale, **window).reshape(T, s.q_size)
        if s.output_gate:
            o = o * torch.sigmoid(parts[3])
        if s.head_gate:
            o = (o.view(T, s.heads, s.head_dim) * torch.sigmoid(parts[-1]).view(T, s.heads, 1)).view(T, s.q_size)
        out = self.o(o)
        if s.bias:
            out = out + self.o_bias
        rows = RingRows if s.window else KVRows
        return out, {keys: rows(k.transpose(0, 1)), values: rows(v.transpose(0, 1))}




def attention_step(spec: AttentionSpec, w: Mapping[str, torch.Tensor], h: torch.Tensor, keys: list, values: list,
                   position: int) -> torch.Tensor:  # fmt: skip
    """One token of causal GQA attention, written for reading: w holds "q", "k", "v", "o"
    ([out, in] fp32), and "q_norm", "k_norm" / "q_bias" ... where the spec has them; `keys`,
    `values` the layer's earlier K (after norm and RoPE) and V rows [kv_heads, head_dim], to
    which this token's are appended (a sliding window sees the last W-1 of them). With the
    output gate, q_proj gives [query | gate] per head and o is multiplied by sigmoid(gate); with
    the head gate, head h's output by sigmoid(w["gate"] @ h)[h]. Returns o_proj's output [C]."""
    s = spec
    bias = (lambda n: w[n]) if s.bias else (lambda n: 0)  # noqa: E731
    if s.output_gate:
        both = (w["q"] @ h + bias("q_bias")).view(s.heads, 2, s.head_dim)
        q, gate = both[:, 0], both[:, 1].reshape(-1)
    else:
        q = (w["q"] @ h + bias("q_bias")).view(s.heads, s.head_dim)
    k = (w["k"] @ h + bias("k_bias")).view(s.kv_heads, s.head_dim)
    v = (w["v"] @ h + bias("v_bias")).view(s.kv_heads, s.head_dim)
    if s.qk_norm:  # per head or over all heads at once; "rms_offset" is the zero-centred norm, gain 1 + w
        offset = 1.0 if s.qk_norm == "rms_offset" else 0.0
        span = (lambda x: x) if s.qk_norm_per_head else (lambda x: x.reshape(-1))  # noqa: E731
        q = rms_norm_naive(span(q), w["q_norm"] + offset, s.norm_eps).view(s.heads, s.head_dim)
        k = rms_norm_naive(span(k), w["k_norm"] + offset, s.norm_eps).view(s.kv_heads, s.head_dim)
    if s.rotary_dim:
        pos = torch.tensor([position])
        q = attention.apply_rotary_naive(q[None], pos, s.rotary_dim, s.rope_theta, s.rope_proportional)[0]
        k = attention.apply_rotary_naive(k[None], pos, s.rotary_dim, s.rope_theta, s.rope_proportional)[0]
    past_k = torch.stack(keys) if keys else torch.zeros(0, s.kv_heads, s.head_dim)
    past_v = torch.stack(values) if values else torch.zeros(0, s.kv_heads, s.head_dim)
    if s.window:
        o = sliding.naive(q, k, v, past_k, past_v, s.window, scale=s.scale).reshape(-1)
    else:
        o = attention.naive(q, k, v, past_k, past_v, scale=s.scale).reshape(-1)
    if s.output_gate:
        o = o * torch.sigmoid(gate)
    if s.head_gate:
        o = (o.view(s.heads, s.head_dim) * torch.sigmoid(w["gate"] @ h).view(s.heads, 1)).reshape(-1)
    keys.append(k)
    values.append(v)
    return w["o"] @ o + bias("o_bias")
