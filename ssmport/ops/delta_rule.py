"""The gated delta rule (Gated DeltaNet, Qwen3.5's linear attention), per value head with
S the [dk, dv] matrix state (key-major):

    S_d = g S;   u = beta (v - S_d^T k);   S' = S_d + k u^T;   o = S'^T q

q and k L2-normalised (q also scaled by dk^-0.5), beta in (0, 1) (or (0, 2)), g = exp(log g)
(fla's `fla/ops/gated_delta_rule`)."""

from __future__ import annotations

import torch

from ssmport.ops.deferred import Outer, StateUpdate
from ssmport.ops.segsum import chunk_decays
from ssmport.ops.triangular import unit_lower_inverse

QK_L2NORM_EPS = 1e-6  # q and k are normalised as x / sqrt(sum(x^2) + 1e-6) (fla's kernels, transformers' l2norm)


def naive_step(s, q, k, v, beta, g):
    """One value head: s [dk, dv], q and k [dk], v [dv], beta and g scalars. Returns (s', o [dv])."""
    s = s * g
    u = beta * (v - s.t() @ k)
    s = s + torch.outer(k, u)
    return s, s.t() @ q


def _reads(S, q, k, v, beta, decay):
    """What a step needs from the old state S: (o [HV, dv], u [HV, 1, dv]). Both reads happen
    before the update, in one matmul: with S_d = decay * S and S' = S_d + k u^T,
        k^T S_d = decay * (k^T S)        and        q^T S' = decay * (q^T S) + (q . k) u,
    so the [HV, dk, dv] state (the bulk of the memory traffic) is read once."""
    HV, dk, dv = S.shape
    qk_S = torch.stack([q, k], dim=1) @ S  # [HV, 2, dv]: q^T S and k^T S
    q_S, k_S = qk_S[:, 0:1], qk_S[:, 1:2]
    u = beta * (v.view(HV, 1, dv) - decay * k_S)  # [HV, 1, dv]
    o = decay * q_S + (q * k).sum(-1).view(HV, 1, 1) * u
    return o.view(HV, dv), u


def step(S, q, k, v, beta, decay):
    """One step for all value heads as batched matmuls: S [HV, dk, dv]; q, k [HV, dk]
    (normalised, q scaled); v [HV, dv]; beta, decay [HV, 1, 1]. Returns (S', o [HV, dv])."""
    HV, dk, dv = S.shape
    o, u = _reads(S, q, k, v, beta, decay)
    return S * decay + k.view(HV, dk, 1) * u, o


def decode(S, q, k, v, beta, decay):
    """Decode's step from the old state, without forming S' (arguments as in `step`).
    Returns (o [HV, dv], the StateUpdate over the [HV, dk, dv] view)."""
    HV, dk, dv = S.shape
    o, u = _reads(S, q, k, v, beta, decay)
    return o, StateUpdate(decay, (Outer(k, u),), (HV, dk, dv), ((HV, 1, 1), (HV, dk, 1), (HV, 1, dv)))


def chunk(S0, q, k, v, beta, log_decay, valid_len, max_tokens: int | None = None):
    """The gated delta rule over a chunk of T tokens in its chunkwise (WY) form: matmuls, no loop.

    S0 [HV,dk,dv] fp32; q, k [T,HV,dk] (normalised, q scaled); v [T,HV,dv]; beta and
    log_decay = log g [T,HV]. Per head, with cum and D[t,s] = exp(cum[t] - cum[s]) from
    ssmport.ops.segsum, the step unrolls to

        (I + L) U = beta (V - exp(cum) K S0),   L[t,s] = beta_t D[t,s] (k_t . k_s) for s < t
        O   = exp(cum) Q S0 + (D o Q K^T) U
        S_T = exp(cum[T-1]) S0 + K^T (D[T-1, :] U)

    L is strictly lower triangular, so (I + L)^-1 = (I - L)(I + L^2)(I + L^4)... with
    ceil(log2 T) factors (those of `max_tokens` when T is symbolic): exact in exact arithmetic,
    and only T x T matmuls. Rows t >= valid_len
    are padding: beta = 0 and g = 1 there, so they change nothing. Returns (S_T, O [T,HV,dv])."""
    T = q.shape[0]
    dtype = S0.dtype
    seg = chunk_decays(log_decay, valid_len)
    beta = beta * seg.real
    up_to, cum, D = seg.up_to, seg.cum, seg.decay
    eye = torch.eye(T, dtype=dtype)
    Q, K, V = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [HV, T, d]
    B = beta.t().unsqueeze(2)  # [HV, T, 1]
    G = torch.exp(cum).unsqueeze(2)  # [HV, T, 1]
    minus_L = -B * (K @ K.transpose(1, 2)) * D * (up_to - eye)
    U = unit_lower_inverse(minus_L, max_tokens) @ (B * (V - G * (K @ S0)))  # [HV, T, dv]
    O = G * (Q @ S0) + ((Q @ K.transpose(1, 2)) * D) @ U
    to_end = D[:, T - 1 : T, :].transpose(1, 2)  # [HV, T, 1]: exp(cum[T-1] - cum[s]) (slices: T may be symbolic)
    S = torch.exp(cum[:, T - 1 : T]).view(-1, 1, 1) * S0 + (K * to_end).transpose(1, 2) @ U
    return S, O.transpose(0, 1).contiguous()
