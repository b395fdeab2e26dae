"""Layers the hybrid families share, composed into their blocks: softmax attention over a KV
cache (the variants Qwen3.5, LFM2, Granite-4.0-H and Nemotron-H use) and the two MLPs.

Each takes the already-normed input h [T, C] and returns its contribution (the family's block
owns the pre-norm, the residual and any multiplier). Weights come from the builder under the
family's canonical names; projections that read the same input are fused into one matmul
(fewer ops here, and fewer dispatches on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.checkpoint import TensorSource
from ssmport.graph import KVRows, Step
from ssmport.ops import attention
from ssmport.ops.norms import rms_norm
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role

KEY_CACHE, VALUE_CACHE = "keyCache", "valueCache"  # Apple's names for the stacked KV states


@dataclass(frozen=True)
class AttentionSpec:
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int = 0  # 0: no positional encoding ("nope"); else rotate-half RoPE on the first dims
    rope_theta: float = 10000.0
    qk_norm: str | None = None  # None | "rms" (x̂·w) | "rms_offset" (x̂·(1+w), Qwen3.5's zero-centred norm)
    norm_eps: float = 1e-6
    output_gate: bool = False  # Qwen3.5: q_proj gives [query | gate] per head; o *= sigmoid(gate)
    scale: float | None = None  # None: head_dim^-0.5 (Granite: attention_multiplier)
    bias: bool = False  # biases on q/k/v/o

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
    q_bias: str | None = None
    k_bias: str | None = None
    v_bias: str | None = None
    o_bias: str | None = None


def norm_gain(weight: torch.Tensor, kind: str | None) -> torch.Tensor:
    """The gain an RMSNorm multiplies by: w, or 1+w for a zero-centred norm (computed once at
    build, the same fp32 sum transformers computes on every call)."""
    return 1.0 + weight.float() if kind == "rms_offset" else weight.float()


class AttentionMixer(nn.Module):
    """Causal GQA attention over the layer's slices of keyCache / valueCache.

    q, k and v (and the output gate) come from one fused matmul; the q/k norms (per head),
    RoPE, the gate and the scale are the spec's. The new K (after norm and RoPE) and V rows go
    back to the graph as KVRows, written at the tokens' positions."""

    states = (KEY_CACHE, VALUE_CACHE)

    def __init__(self, spec: AttentionSpec, names: AttentionNames, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.spec, s = spec, spec
        q, gate = src[names.q].float(), None
        if s.output_gate:  # rows per head [query (hd) | gate (hd)]
            both = q.view(s.heads, 2, s.head_dim, -1)
            q, gate = both[:, 0].reshape(s.q_size, -1), both[:, 1].reshape(s.q_size, -1)
        rows = [q, src[names.k].float(), src[names.v].float()] + ([gate] if gate is not None else [])
        self.split = [r.shape[0] for r in rows]  # q | k | v (| gate)
        self.qkv = b.matmul("{" + ",".join((names.q, names.k, names.v)) + "}", torch.cat(rows).t(), Role.ATTN_PROJ)
        del rows, q, gate
        if s.bias:
            bias = torch.cat([src[names.q_bias], src[names.k_bias], src[names.v_bias]])
            self.qkv_bias = b.vector("{" + ",".join((names.q_bias, names.k_bias, names.v_bias)) + "}", bias, Role.ATTN_PROJ)
            self.o_bias = b.vector(names.o_bias, src[names.o_bias], Role.ATTN_PROJ)
        self.o = b.matmul(names.o, src[names.o].t(), Role.ATTN_PROJ)
        if s.qk_norm:
            self.q_norm = b.vector(names.q_norm, norm_gain(src[names.q_norm], s.qk_norm), Role.NORM)
            self.k_norm = b.vector(names.k_norm, norm_gain(src[names.k_norm], s.qk_norm), Role.NORM)
        if s.rotary_dim:  # graph constants (not buffers: the states are the only buffers)
            self.inv_freq = attention.rotary_frequencies(s.head_dim, s.rotary_dim, s.rope_theta)
            self.rotate = attention.rotate_half_matrix(s.head_dim, s.rotary_dim)

    def forward(self, h: torch.Tensor, slices: dict, step: Step):
        s, T = self.spec, h.shape[0]
        qkv = self.qkv(h)
        if s.bias:
            qkv = qkv + self.qkv_bias
        parts = qkv.split(self.split, dim=-1)
        q, k, v = parts[0].view(T, s.heads, s.head_dim), parts[1].view(T, s.kv_heads, s.head_dim), parts[2]
        if s.qk_norm:
            q, k = rms_norm(q, self.q_norm, s.norm_eps), rms_norm(k, self.k_norm, s.norm_eps)
        if s.rotary_dim:
            cos, sin = attention.rotary_tables(step.positions, self.inv_freq)
            q, k = attention.apply_rotary(q, cos, sin, self.rotate), attention.apply_rotary(k, cos, sin, self.rotate)
        v = v.view(T, s.kv_heads, s.head_dim)
        K, V = slices[KEY_CACHE].float(), slices[VALUE_CACHE].float()
        scale = s.scale if s.scale is not None else s.head_dim**-0.5
        if step.decode:
            o = attention.decode(q.view(s.heads, -1), k.view(s.kv_heads, -1), v.view(s.kv_heads, -1), K, V,
                                 step.positions, scale).view(1, s.q_size)  # fmt: skip
        else:
            o = attention.chunk(q, k, v, K, V, step.positions[0:1], scale).reshape(T, s.q_size)
        if s.output_gate:
            o = o * torch.sigmoid(parts[3])
        out = self.o(o)
        if s.bias:
            out = out + self.o_bias
        return out, {KEY_CACHE: KVRows(k.transpose(0, 1)), VALUE_CACHE: KVRows(v.transpose(0, 1))}


class SwiGLU(nn.Module):
    """down(silu(gate(h)) * up(h)), gate and up fused in one [C, 2F] matmul."""

    def __init__(self, gate: str, up: str, down: str, src: TensorSource, b: WeightBuilder, fused: str | None = None):
        """`fused`: the name of a checkpoint tensor that already holds [gate; up] (Granite's
        input_linear), instead of separate `gate` and `up` tensors."""
        super().__init__()
        weight = src[fused] if fused else torch.cat([src[gate], src[up]])
        self.size = weight.shape[0] // 2
        self.gate_up = b.matmul(fused or f"{{{gate},{up}}}", weight.t(), Role.FFN)
        self.down = b.matmul(down, src[down].t(), Role.FFN)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(h).split([self.size, self.size], dim=-1)
        return self.down(F.silu(g) * u)


class ReluSquaredMLP(nn.Module):
    """down(relu(up(h))^2) (Nemotron-H's MLP, RWKV-7's channel mix without the shift)."""

    def __init__(self, up: str, down: str, src: TensorSource, b: WeightBuilder):
        super().__init__()
        self.up = b.matmul(up, src[up].t(), Role.FFN)
        self.down = b.matmul(down, src[down].t(), Role.FFN)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.up(h))
        return self.down(a * a)
