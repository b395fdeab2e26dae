"""Layers the families share, composed into their blocks: softmax attention over a KV cache (the
variants Qwen3.5, LFM2, Granite-4.0-H and Nemotron-H use), the gated delta-rule layer (Gated
DeltaNet and Qwen3.5's linear attention) and the two MLPs.

Each takes the already-normed input h [T, C] and returns its contribution (the family's block
owns the pre-norm, the residual and any multiplier). Weights come from the builder under the
family's canonical names; projections that read the same input are fused into one matmul
(fewer ops here, and fewer dispatches on a GPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Embedding, KVRows, NormHead, RingRows, Step
from ssmport.ops import attention, delta_rule, sliding
from ssmport.ops.conv import causal_conv
from ssmport.ops.norms import l2_normalize, rms_norm
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role

KEY_CACHE, VALUE_CACHE = "keyCache", "valueCache"  # Apple's names for the stacked KV states
# The sliding-window layers' rings (kind "ring"): static shapes named "...Cache", which Apple's
# engines' heuristic takes for a sliding cache (docs/apple-engines.md).
SLIDING_KEY_CACHE, SLIDING_VALUE_CACHE = "slidingKeyCache", "slidingValueCache"
CONV_STATES, RECURRENT_STATES = "convStates", "recurrentStates"  # and for its stacked fixed states


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
            self.rotate = attention.rotate_half_matrix(s.head_dim, s.head_dim if s.rope_proportional else s.rotary_dim)

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
            cos, sin = attention.rotary_tables(step.positions, self.inv_freq)
            q, k = attention.apply_rotary(q, cos, sin, self.rotate), attention.apply_rotary(k, cos, sin, self.rotate)
        v = v.view(T, s.kv_heads, s.head_dim)
        keys, values = self.states
        K, V = slices[keys].float(), slices[values].float()
        scale = s.scale if s.scale is not None else s.head_dim**-0.5
        ops = sliding if s.window else attention
        if step.decode:
            o = ops.decode(q.view(s.heads, -1), k.view(s.kv_heads, -1), v.view(s.kv_heads, -1), K, V,
                           step.positions, scale).view(1, s.q_size)  # fmt: skip
        else:
            o = ops.chunk(q, k, v, K, V, step.positions[0:1], scale).reshape(T, s.q_size)
        if s.output_gate:
            o = o * torch.sigmoid(parts[3])
        if s.head_gate:
            o = (o.view(T, s.heads, s.head_dim) * torch.sigmoid(parts[-1]).view(T, s.heads, 1)).view(T, s.q_size)
        out = self.o(o)
        if s.bias:
            out = out + self.o_bias
        rows = RingRows if s.window else KVRows
        return out, {keys: rows(k.transpose(0, 1)), values: rows(v.transpose(0, 1))}


@dataclass(frozen=True)
class DeltaRuleSpec:
    """A gated delta-rule layer: k_heads query/key heads of k_dim, v_heads value heads of
    v_dim (value head j reads q/k head j // (v_heads / k_heads)), a depthwise causal conv of
    conv_kernel taps over the q | k | v inputs."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int
    conv_bias: bool = False
    output_gate: bool = True  # o = norm(o) * silu(gate projection)
    allow_neg_eigval: bool = False  # beta in (0, 2)
    norm_eps: float = 1e-6

    @property
    def key_dim(self) -> int:
        return self.k_heads * self.k_dim

    @property
    def value_dim(self) -> int:
        return self.v_heads * self.v_dim

    @property
    def conv_dim(self) -> int:  # the conv's channels: q | k | v
        return 2 * self.key_dim + self.value_dim

    @property
    def group(self) -> int:
        return self.v_heads // self.k_heads


@dataclass(frozen=True)
class DeltaRuleNames:
    """Canonical weight names of one delta-rule layer, and the plan names of what is fused."""

    conv_input: tuple[str, ...]  # projections whose outputs the conv reads, q | k | v rows in order
    a: str  # the decay's input projection [v_heads, C]
    b: str  # beta's projection [v_heads, C]
    gate: str | None  # the output gate's projection [value_dim, C]
    conv: tuple[str, ...]  # depthwise conv weights [D, 1, K], in conv_input's order
    conv_bias: tuple[str, ...]
    A_log: str
    dt_bias: str
    norm: str  # the per-head output RMSNorm gain [v_dim] (plain weight)
    out: str
    fused_in: str  # plan name of conv_input | a | b (| gate) as one matmul
    fused_conv: str  # plan name of the conv weights as one [K, D] table
    fused_conv_bias: str | None = None


class DeltaRuleMixer(nn.Module):
    """The gated delta-rule layer on the normed input h [T, C]:

        q | k | v = silu(causal_conv(h W_qkv));  q, k l2-normalised, q * k_dim^-0.5
        beta = sigmoid(h W_b) (x2 with allow_neg_eigval);  log g = -exp(A_log) softplus(h W_a + dt_bias)
        o = delta rule (ssmport.ops.delta_rule);  out = W_o (rmsnorm(o) * w * silu(h W_gate))

    States: `conv_state` [P, 2*key_dim + value_dim] (the last P pre-conv inputs, oldest first;
    P = K-1 or K, the taps read the last K-1 rows) and `rec_state` [v_heads, k_dim, v_dim]
    (key-major). Every projection of h is one fused matmul; the recurrence runs in fp32."""

    def __init__(self, spec: DeltaRuleSpec, names: DeltaRuleNames, src: TensorSource, b: WeightBuilder,
                 conv_state: str, rec_state: str):  # fmt: skip
        super().__init__()
        self.spec, self.conv_state, self.rec_state = spec, conv_state, rec_state
        self.states = (conv_state, rec_state)
        streams = [*names.conv_input, names.a, names.b] + ([names.gate] if spec.output_gate else [])
        sizes = [src.shape(n)[0] for n in streams]
        self.in_split = [sum(sizes[: len(names.conv_input)]), *sizes[len(names.conv_input) :]]  # qkv, a, b, (gate)
        fused = torch.cat([src[n] for n in streams]).t()
        self.in_proj = b.matmul(names.fused_in, fused, Role.STATE_PROJ)
        del fused
        taps = [src[n].reshape(src.shape(n)[0], -1).t() for n in names.conv]
        self.conv_w = b.vector(names.fused_conv, torch.cat(taps, 1), Role.CONV)  # [K, D]
        if spec.conv_bias:
            self.conv_b = b.vector(names.fused_conv_bias, torch.cat([src[n] for n in names.conv_bias]), Role.CONV)
        self.neg_A = b.vector(names.A_log, -torch.exp(src[names.A_log].float()), Role.DECAY)  # stored as -exp(A_log)
        self.dt_bias = b.vector(names.dt_bias, src[names.dt_bias], Role.DECAY)
        self.o_norm = b.vector(names.norm, src[names.norm], Role.NORM)
        self.o_proj = b.matmul(names.out, src[names.out].t(), Role.OUT_PROJ)

    def forward(self, h: torch.Tensor, slices: dict, step: Step):
        """h [T, C] fp32; rows >= valid_len (prefill) are padding: computed, never stored.
        Returns (out [T, C], {conv_state: new rows, rec_state: StateUpdate | new state})."""
        s = self.spec
        H, HV, dk, dv = s.k_heads, s.v_heads, s.k_dim, s.v_dim
        T = h.shape[0]
        parts = self.in_proj(h).split(self.in_split, dim=-1)
        qkv, new_conv = causal_conv(slices[self.conv_state].float(), parts[0], self.conv_w, step.valid_len)
        if s.conv_bias:
            qkv = qkv + self.conv_b
        q, k, v = F.silu(qkv).split([s.key_dim, s.key_dim, s.value_dim], dim=-1)
        q = l2_normalize(q.reshape(T, H, dk), delta_rule.QK_L2NORM_EPS) * dk**-0.5
        k = l2_normalize(k.reshape(T, H, dk), delta_rule.QK_L2NORM_EPS)
        if s.group > 1:  # value head hv reads q/k head hv // group
            q = q.view(T, H, 1, dk).expand(T, H, s.group, dk).reshape(T, HV, dk)
            k = k.view(T, H, 1, dk).expand(T, H, s.group, dk).reshape(T, HV, dk)
        beta = torch.sigmoid(parts[2]).view(T, HV, 1, 1)
        if s.allow_neg_eigval:
            beta = beta * 2.0
        log_decay = self.neg_A * F.softplus(parts[1] + self.dt_bias)  # [T, HV]

        # The recurrence, in fp32 whatever the state dtype.
        v, S = v.reshape(T, HV, dv), slices[self.rec_state].float()
        if step.decode:
            o, S = delta_rule.decode(S, q.view(HV, dk), k.view(HV, dk), v.view(HV, dv), beta.view(HV, 1, 1),
                                     torch.exp(log_decay).view(HV, 1, 1))  # fmt: skip
            o = o.view(1, HV, dv)
        else:
            S, o = delta_rule.chunk(S, q, k, v, beta.view(T, HV), log_decay, step.valid_len, step.max_rows)
        o = rms_norm(o, self.o_norm, s.norm_eps).reshape(T, s.value_dim)
        if s.output_gate:
            o = o * F.silu(parts[3])
        return self.o_proj(o), {self.conv_state: new_conv, self.rec_state: S}


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


class ScaledEmbedding(Embedding):
    """The embedding rows times embedding_multiplier (in fp32, after the lookup, as transformers)."""

    def __init__(self, table: nn.Parameter, multiplier: float):
        super().__init__(table)
        self.multiplier = multiplier

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) * self.multiplier


def norm_head(src: TensorSource, b: WeightBuilder, head: str, norm: str, eps: float,
              gain: torch.Tensor | None = None, bias: str | None = None) -> NormHead:  # fmt: skip
    """The final norm and the LM head (stored [in, out], logits in the recipe's dtype): an
    RMSNorm of gain `gain` (default: the checkpoint's `norm` as it is), or a LayerNorm with `bias`."""
    weight = b.vector(norm, src[norm] if gain is None else gain, Role.NORM)
    shift = b.vector(bias, src[bias], Role.NORM) if bias else None
    return NormHead(b.matmul(head, src[head].t(), Role.HEAD, out_dtype=b.recipe.logits_dtype), weight, eps, bias=shift)
