"""RWKV-7's WKV recurrence, per head, with S the [K, V] matrix state (key-major, fla's layout):

    S' = diag(w) S - (kk * a) (kk^T S) + k v^T          y = r^T S'

w the per-key decay, kk the unit "removal key", a the in-context learning rate (BlinkDL's
`RWKV_x070`, fla's `chunk_rwkv7`)."""

from __future__ import annotations

import torch

from ssmport.ops.deferred import Outer, StateUpdate
from ssmport.ops.triangular import unit_lower_inverse


def naive_step(s, r, w, kk, a, k, v):
    """One head in BlinkDL's layout, s [V, K] (the transpose of ours): the readable spec.
    Returns (s', y [V])."""
    s = s * w[None, :] - torch.outer(s @ kk, kk * a) + torch.outer(v, k)
    return s, s @ r


def step(S, r, decay, kk, kka, k, v):
    """One step for all heads (prefill's loop body), shaped to broadcast without reshapes:
    S [1,H,N,Nv] fp32; row vectors r, kk [1,H,1,N] and v [1,H,1,Nv]; column vectors decay,
    kka = kk*a, k [1,H,N,1]. Returns (S', y [1,H,1,Nv])."""
    S = S * decay - kka * (kk @ S) + k * v
    return S, r @ S


def decode(S, r, decay, kk, kka, k, v, rk=None):
    """Decode's step from the old state, without forming S' (the graph applies every layer's
    update to the whole state at once, ssmport.ops.deferred):

        r^T S' = (r*decay)^T S - (r.(kk*a)) (kk^T S) + (r.k) v^T

    S [H,N,Nv] fp32; r, decay, kk, kka = kk*a, k as head rows [H,1,N]; v [H,1,Nv]; `rk` r*k
    when the caller has it (RWKV-7's bonus term reads it too). Every operand keeps this shape
    from the projections' one reshape each: no reshape here, and the two reads of S are
    batched matmuls over the heads. Returns (y [H,1,Nv], the StateUpdate over the [H, N, Nv]
    view)."""
    H, N, Nv = S.shape
    rk = r * k if rk is None else rk
    kk_S = kk @ S  # [H,1,Nv]
    y = (r * decay) @ S - (r * kka).sum(dim=-1, keepdim=True) * kk_S + rk.sum(dim=-1, keepdim=True) * v
    col, row = (H, N, 1), (H, 1, Nv)
    update = StateUpdate(decay, (Outer(kka, kk_S, minus=True), Outer(k, v)), (H, N, Nv), (col, col, row, col, row))
    return y, update


def chunk(S0, r, decay, kk, kka, k, v, valid_len, max_tokens: int | None = None):
    """The WKV recurrence over a chunk of T tokens in its chunkwise (WY) form: matmuls, no loop.

    S0 [H,N,Nv] fp32; r, decay, kk, kka = kk*a, k [T,H,N]; v [T,H,Nv]. With L[t] the per-key
    prefix sums of log decay (L[-1] = 0), u[s] = S_{s-1}^T kk[s] (the removal reads) solve

        (I + A) U = (kk * exp(L[s-1])) S0 + Ak V,
        A[s,j]  = sum_i kk[s,i] kka[j,i] exp(L[s-1,i] - L[j,i]),  Ak likewise with k, for j < s

    and then, with the same pairwise decays up to t inclusive,

        y[t]  = (r[t] * exp(L[t])) S0 + sum_{j<=t} (r[t] . (k[j] exp(L[t]-L[j]))) v[j] - (... kka ...) u[j]
        S_end = exp(L[T-1]) S0 + (k * exp(L[T-1] - L))^T V - (kka * exp(L[T-1] - L))^T U

    which unrolls S_t = diag(w_t) S_{t-1} - kka_t (kk_t^T S_{t-1}) + k_t v_t^T exactly up to
    rounding. Each pairwise decay is a product exp(L[s]) exp(-L[j]) of two [T,N] factors, so
    every product is a [T,N] @ [N,T] matmul; that is safe in fp32 while the chunk's total log
    decay stays inside fp32's exponent range: w > exp(-exp(-0.5)) bounds it by 0.61 per token,
    so T <= 128 (`MAX_CHUNK`). (I + A)^-1 = (I - A)(I + A^2)(I + A^4)... (A is strictly lower
    triangular), solved in two levels above 16 tokens (ssmport.ops.triangular: one level
    drifted by 6e-3 over 64 tokens of rwkv7-0.1b synthetic, even in torch fp32). Rows t >= valid_len are
    padding: decay 1, kka = k = 0, so they change nothing.
    Returns (S_end [H,N,Nv], y [T,H,Nv])."""
    T = r.shape[0]
    dtype = S0.dtype
    real = (torch.arange(T) < valid_len).to(dtype).view(T, 1, 1)
    heads = lambda x: x.transpose(0, 1)  # noqa: E731  [T,H,d] -> [H,T,d]
    log_w = heads(torch.log(decay) * real)  # [H,T,N]; padding rows: log 1 = 0
    kka, k, R, C, V = heads(kka * real), heads(k * real), heads(r), heads(kk), heads(v)
    up_to = torch.tril(torch.ones(T, T, dtype=dtype))  # [t, s] = s <= t
    strict = up_to - torch.eye(T, dtype=dtype)
    L = up_to @ log_w  # [H,T,N] inclusive prefix sums, as one matmul
    L_prev = L - log_w  # exclusive: L[t-1]
    grow, shrink = torch.exp(L_prev), torch.exp(-L)  # the two factors of every pairwise decay
    Cg = C * grow  # kk[s] exp(L[s-1])
    A = (Cg @ (kka * shrink).transpose(1, 2)) * strict  # [H,T,T]
    Ak = (Cg @ (k * shrink).transpose(1, 2)) * strict
    U = unit_lower_inverse(-A, max_tokens) @ (Cg @ S0 + Ak @ V)  # [H,T,Nv] the removal reads u[s]
    Rg = R * torch.exp(L)  # r[t] exp(L[t])
    Qk = (Rg @ (k * shrink).transpose(1, 2)) * up_to
    Qb = (Rg @ (kka * shrink).transpose(1, 2)) * up_to
    y = Rg @ S0 + Qk @ V - Qb @ U
    L_end = L[:, T - 1 : T, :]  # [H,1,N]
    to_end = torch.exp(L_end - L)  # [H,T,N] exp(L[T-1] - L[j]) <= 1
    S = torch.exp(L_end).transpose(1, 2) * S0 + (k * to_end).transpose(1, 2) @ V - (kka * to_end).transpose(1, 2) @ U
    return S, y.transpose(0, 1).contiguous()


MAX_CHUNK = 128  # the longest chunk `chunk` keeps inside fp32's exponent range (see there)
