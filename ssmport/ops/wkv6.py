"""RWKV-6's WKV recurrence, per head, with S the [K, V] matrix state (key-major, as the `rwkv`
package and fla keep it):

    y = r^T (S + diag(u) k v^T)          S' = diag(w) S + k v^T

w = exp(-exp(.)) the data-dependent per-key decay, u the per-key bonus `time_faaaa` (BlinkDL's
`RWKV_x060`, fla's `chunk_rwkv6`).

The decay has no lower bound: a trained model's log decay -exp(.) reaches -20 per token and
beyond. RWKV-7's chunk form factorises each pairwise decay as exp(L[t]) exp(-L[j]), which
overflows fp32 once the chunk's total log decay passes -88 (five such tokens). `chunk` below
never forms a positive exponent: each pair's log decay is the sum of the log decays strictly
between them, summed as such (a 0/1 interval matrix times the log decays), so every exponent
is <= 0 and exact to fp32 rounding whatever the decay."""

from __future__ import annotations

import torch

from ssmport.ops.deferred import Outer, StateUpdate

PAIR_BLOCK = 16  # tokens per pairwise block of `chunk`: its [H, T, B, K] decay tensor bounds memory


def naive_step(s, r, log_w, u, k, v):
    """One head, s [K, V]; r, log_w = log decay (<= 0), u, k [K]; v [V]: the readable spec.
    Returns (s', y [V])."""
    kv = torch.outer(k, v)
    y = r @ (s + u[:, None] * kv)
    return s * torch.exp(log_w)[:, None] + kv, y


def decode(S, r, log_w, u, k, v):
    """One token for all heads from the old state, y = r^T S + (r . (u * k)) v, and the new
    state as a StateUpdate (ssmport.ops.deferred applies every layer's at once).
    S [H,K,V] fp32; r, log_w, k [H,K]; u [H,K]; v [H,V]. Returns (y [H,V], update)."""
    H, K, V = S.shape
    y = (r.view(H, 1, K) @ S).view(H, V) + (r * u * k).sum(dim=-1, keepdim=True) * v
    col, row = (H, K, 1), (H, 1, V)
    return y, StateUpdate(torch.exp(log_w), (Outer(k, v),), (H, K, V), (col, col, row))


def _intervals(B: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """0/1 matrices selecting, for each pair (t, j) with j < t, the tokens s with j < s < t
    ([B, B, B]: B matrices, one per t, so a batched matmul needs no [B*B] reshape, which a
    symbolic B cannot take), and for each j the tokens s > j up to the block's end ([B, B])."""
    ones = torch.ones(B, B, dtype=dtype)
    after = torch.triu(ones, diagonal=1)  # [j, s] = s > j
    between = torch.tril(ones, diagonal=-1).unsqueeze(1) * after.unsqueeze(0)  # [t, j, s] = (s < t) and (s > j)
    return between, after


def _blocks(S0, r, log_w, u, k, v):
    """The pairwise form over n blocks of B tokens at once, heads first: S0 [H,K,V]; r, log_w,
    k [H,n,B,K]; u [H,1,1,K]; v [H,n,B,V]. Within block b, from its first state S_b:

        y[t]  = (r[t] * exp(P[t]))^T S_b + sum_{j<t} (sum_i r[t,i] k[j,i] exp(D[t,j,i])) v[j] + (r[t].(u*k[t])) v[t]
        S_b+1 = exp(P[B]) S_b + sum_j (k[j] * exp(E[j])) v[j]^T

    with P[t] = sum_{s<t} log_w[s], D[t,j] = sum_{j<s<t} log_w[s], E[j] = sum_{s>j} log_w[s]:
    sums of non-positive terms, so every exp is <= 1. Only the n-step chain of block states
    is sequential. Returns (S_end, y [H,n,B,V])."""
    H, n, B, K = r.shape
    between, after = _intervals(B, r.dtype)
    before = after.t()  # [t, s] = s < t
    D = between @ log_w.unsqueeze(2)  # [H,n,B,B,K]: [h, b, t, j, i]
    strict = before.view(B, B, 1)  # only j < t; D is 0 elsewhere, so exp stays finite
    A = (r.unsqueeze(3) * k.unsqueeze(2) * torch.exp(D) * strict).sum(dim=-1)  # [H,n,B,B]
    y = A @ v + (r * u * k).sum(dim=-1, keepdim=True) * v
    decay = torch.exp(log_w.sum(dim=2)).unsqueeze(-1)  # [H,n,K,1] the whole block's decay
    added = (k * torch.exp(after @ log_w)).transpose(2, 3) @ v  # [H,n,K,V]
    starts, S = [], S0
    for b in range(n):
        starts.append(S)
        S = decay[:, b] * S + added[:, b]
    first = starts[0].unsqueeze(1) if n == 1 else torch.stack(starts, dim=1)  # [H,n,K,V]
    return S, y + (r * torch.exp(before @ log_w)) @ first


def chunk(S0, r, log_w, u, k, v, valid_len, pair_block: int = PAIR_BLOCK, max_tokens: int | None = None):
    """The WKV recurrence over a chunk of T tokens: blocks of B = `pair_block` tokens in the
    pairwise form (`_blocks`). Memory: the [H, T, B, K] pairwise decays; one block of T when T
    is not a multiple of B or is symbolic (a dynamic-shape export, up to `max_tokens`). Exact
    for any decay: no exponent is positive.

    S0 [H,K,V] fp32; r, log_w (<= 0), k [T,H,K]; u [H,K]; v [T,H,V]. Rows t >= valid_len are
    padding: log decay 0 and k = 0, so they change nothing. Returns (S_end, y [T,H,V])."""
    T, H, K = r.shape
    V = v.shape[-1]
    B = pair_block if max_tokens is None and T % pair_block == 0 else T
    real = (torch.arange(T) < valid_len).to(S0.dtype).view(T, 1, 1)
    blocks = lambda x: x.transpose(0, 1).reshape(H, -1, B, x.shape[-1])  # noqa: E731  [T,H,d] -> [H,n,B,d]
    S, y = _blocks(S0, blocks(r), blocks(log_w * real), u.view(H, 1, 1, K), blocks(k * real), blocks(v))
    return S, y.reshape(H, T, V).transpose(0, 1).contiguous()
