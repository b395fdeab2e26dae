"""RecurrentGemma's RG-LRU (Griffin's real-gated linear recurrent unit; transformers'
`RecurrentGemmaRglru`): a diagonal recurrence over the D = lru_width channels, its two gates
block-diagonal (one [d, d] matrix per head, d = D / heads):

    i_t = sigmoid(x_t W_i + b_i)                 r_t = sigmoid(x_t W_r + b_r)
    log a_t = -C softplus(Λ) r_t   (C = 8)       u_t = i_t x_t sqrt(1 - a_t²)
    h_t = a_t h_(t-1) + u_t                      y_t = h_t

At position 0 transformers resets: a_0 = 0 (the carried state is dropped) and u_0 = i_0 x_0
(no sqrt(1 - a²) scaling). sqrt(1 - a²) is computed as transformers does, 1 - exp(2 log a).

`chunk` is exact for any decay: a trained Λ with r near 1 gives log a of -8 softplus(Λ) per
token, so a prefix product of a's underflows within a chunk; every exponent below is a sum
of log decays strictly inside an interval (a 0/1 interval matrix times the log decays, as
ssmport.ops.wkv6), so each is <= 0 and nothing is ever divided back out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DECAY_SCALE = 8.0  # C: transformers' and Griffin's constant in log a = -C softplus(Λ) r
PAIR_BLOCK = 16  # tokens per pairwise block of `chunk`: its [n, B, B, D] decay tensor bounds memory


def naive_step(h, x, w_i, b_i, w_r, b_r, lam, first: bool):
    """One token, written for reading: h, x [D]; w_i, w_r [heads, d, d]; b_i, b_r [heads, d];
    lam = Λ [D]; `first`: this token is at position 0. Returns (h', y [D])."""
    heads, d, _ = w_i.shape
    xh = x.view(heads, d)
    i = torch.sigmoid(torch.einsum("hd,hde->he", xh, w_i) + b_i).reshape(-1)
    r = torch.sigmoid(torch.einsum("hd,hde->he", xh, w_r) + b_r).reshape(-1)
    log_a = -DECAY_SCALE * r * F.softplus(lam)
    scale = torch.ones_like(x) if first else torch.sqrt(1 - torch.exp(2 * log_a))
    h = (0 if first else torch.exp(log_a) * h) + i * x * scale
    return h, h


def gate(x, w, b, rate, positions):
    """Both gates as one batched matmul, and the recurrence's inputs: x [T, D]; w [heads, d, 2d]
    ([W_i | W_r] per head), b [heads, 1, 2d]; rate = C softplus(Λ) [D]; positions int [T].
    Returns (log a [T, D] (<= 0), u [T, D], reset [T, 1]: 1.0 at position 0)."""
    T, D = x.shape
    heads, d = w.shape[0], w.shape[1]
    both = torch.sigmoid(x.view(T, heads, d).transpose(0, 1) @ w + b)  # [heads, T, 2d]
    i, r = (g.transpose(0, 1).reshape(T, D) for g in both.split([d, d], dim=-1))
    log_a = -rate * r
    reset = (positions.view(T, 1) == 0).to(x.dtype)
    scale = torch.sqrt(1 - torch.exp(2 * log_a))
    return log_a, i * x * (reset + (1 - reset) * scale), reset


def decode(h, log_a, u, reset):
    """One token: h [D] the carried state; log_a, u [1, D]; reset [1, 1]. Returns h' [1, D]
    (the output and the new state)."""
    return torch.exp(log_a) * (1 - reset) * h.view(1, -1) + u


def _intervals(B: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """0/1 matrices: for each t, the tokens s with j < s <= t for each j ([B, B, B]: one
    matrix per t, so a batched matmul needs no [B*B] reshape), and [t, s] = s <= t."""
    upto = torch.tril(torch.ones(B, B, dtype=dtype))  # [t, s] = s <= t
    after = torch.triu(torch.ones(B, B, dtype=dtype), diagonal=1)  # [j, s] = s > j
    return upto.unsqueeze(1) * after.unsqueeze(0), upto


def _blocks(h0, log_a, u, reset):
    """n blocks of B tokens at once: h0 [D]; log_a, u [n, B, D]; reset [n, B, 1]. Within a
    block, from its first state S_b:

        h[t] = sum_{j<=t} exp(sum_{j<s<=t} log a[s]) [no reset in (j, t]] u[j]
             + exp(sum_{s<=t} log a[s]) [no reset in [0, t]] S_b

    every exponent a sum of non-positive terms. Only the n-step chain of block states is
    sequential (S_b+1 = h[B-1] of block b). Returns h [n, B, D]."""
    n, B, D = log_a.shape
    between, upto = _intervals(B, log_a.dtype)
    pair = torch.exp(between @ log_a.unsqueeze(1))  # [n, B(t), B(j), D]
    kept = (between @ reset.unsqueeze(1) == 0).to(log_a.dtype) * upto.view(B, B, 1)  # j <= t, no reset between
    inner = (pair * kept * u.unsqueeze(1)).sum(dim=2)  # [n, B, D]
    carry = torch.exp(upto @ log_a) * (upto @ reset == 0).to(log_a.dtype)  # [n, B, D]: what S_b still weighs
    S, out = h0.view(1, D), []
    for b in range(n):
        out.append(inner[b] + carry[b] * S)
        S = out[-1][B - 1 : B]
    return out[0].unsqueeze(0) if n == 1 else torch.stack(out)


def chunk(h0, log_a, u, reset, valid_len, pair_block: int = PAIR_BLOCK, max_tokens: int | None = None):
    """The recurrence over a chunk of T tokens: h0 [D]; log_a, u [T, D]; reset [T, 1]; rows
    t >= valid_len are padding (log a 0, u 0, no reset: the state passes them unchanged).
    Blocks of B = `pair_block` tokens (memory: the [T/B, B, B, D] pairwise decays); one block
    of T when T is not a multiple of B or is symbolic (`max_tokens` set). Returns (h [T, D]:
    the outputs, the state after the last real token [D])."""
    T, D = log_a.shape
    B = pair_block if max_tokens is None and T % pair_block == 0 else T
    real = (torch.arange(T) < valid_len).to(log_a.dtype).view(T, 1)
    h = _blocks(h0, (log_a * real).view(-1, B, D), (u * real).view(-1, B, D), (reset * real).view(-1, B, 1))
    h = h.reshape(T, D)
    return h, h[T - 1]


def chunk_naive(h0, log_a, u, reset, valid_len: int):
    """The M=1 loop over the real rows of a chunk (the twin of `chunk`)."""
    h, out = h0.clone(), torch.zeros_like(u)
    for t in range(int(valid_len)):
        h = (0 if bool(reset[t]) else torch.exp(log_a[t]) * h) + u[t]
        out[t] = h
    return out, h
