"""The gated delta-rule layer (Gated DeltaNet, Qwen3.5's and OLMo-Hybrid's linear attention):
its export form on ssmport.ops.delta_rule, and one token of it as the references write it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.loader.checkpoint import TensorSource
from ssmport.graph import Step
from ssmport.ops import delta_rule
from ssmport.ops.conv import causal_conv
from ssmport.ops.norms import l2_normalize, l2_normalize_naive, rms_norm, rms_norm_naive
from ssmport.ops.rows import repeat_groups
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role


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
            q, k = repeat_groups(q, 1, s.group), repeat_groups(k, 1, s.group)  # [T, HV, dk]
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


def delta_rule_token(d: DeltaRuleSpec, window: torch.Tensor, S: torch.Tensor, qkv: torch.Tensor, conv: torch.Tensor,
                     beta: torch.Tensor, g: torch.Tensor, gate: torch.Tensor, norm: torch.Tensor, eps: float):  # fmt: skip
    """One token of a Gated DeltaNet layer as the references write it, from its projections:
    `window` the last K pre-conv inputs [K, conv_dim] (row 0 oldest), `qkv` this token's,
    `conv` the depthwise weight [conv_dim, 1, K]; beta, g (the decay, not its log) [Hv]; S
    [Hv, dk, dv], updated in place, head by head (value head j reads q/k head j // group).
    Returns (the new window, o [value_dim] after the gated norm w * rmsnorm(o_j) * silu(gate_j))."""
    dk, dv, group = d.k_dim, d.v_dim, d.group
    window = torch.cat([window[1:], qkv[None]])
    u = F.silu((window * conv[:, 0].t()).sum(0))  # tap K-1 multiplies the newest input
    q, k, v = u[: d.key_dim], u[d.key_dim : 2 * d.key_dim], u[2 * d.key_dim :]
    out = torch.empty(d.value_dim)
    for j in range(d.v_heads):
        ks, vs = slice((j // group) * dk, (j // group + 1) * dk), slice(j * dv, (j + 1) * dv)
        qj = l2_normalize_naive(q[ks], delta_rule.QK_L2NORM_EPS) * dk**-0.5
        kj = l2_normalize_naive(k[ks], delta_rule.QK_L2NORM_EPS)
        S[j], o = delta_rule.naive_step(S[j], qj, kj, v[vs], beta[j], g[j])
        out[vs] = rms_norm_naive(o, norm, eps) * F.silu(gate[vs])
    return window, out
