"""Mamba-1's selective scan: a per-channel state h [I, N] with its own decay per (channel, state)

    h' = exp(dt * A) * h + (dt * x) B^T        y = h' C   (+ D x, by the caller)

dt, x [I]; A [I, N] (negative); B, C [N] shared by the channels (Gu & Dao, 2023). Unlike
Mamba-2's scalar decay per head (ops.ssd), the decay differs per state entry, so the chunk
form cannot factor it out of a matmul, and a factorised exp(cum) exp(-cum) overflows fp32.
`chunk` steps through blocks instead, every block at once (no loop op, decays <= 1 only);
`chunk_pairwise` is the matmul form with every exponent <= 0, 3-6x slower here at mamba-130m's
layer shape (benchmarks/selective_scan_blocks.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssmport.ops.deferred import Exp, Outer, StateUpdate

SUB_CHUNK = 8  # the block length c: `chunk` runs c + T/c steps; chunk_pairwise holds T*c*I*N fp32


def naive_step(h, x, dt, A, B, C):
    """h [I, N], x and dt [I], A [I, N], B and C [N]. Returns (h', y [I])."""
    h = h * torch.exp(dt[:, None] * A) + (dt * x)[:, None] * B[None, :]
    return h, h @ C


def decode(h, dt, A, u, B, C):
    """Decode's output from the old state, without forming h':  y = ((h * exp(dt A)) . C) + u (B.C).

    h [I, N] fp32; dt [I]; A [I, N] (the layer's weight); u = dt x [I]; B, C [N]. Returns
    (y [I], the StateUpdate h' = h * exp(dt A) + u B^T over the [I, N] view, its decay an `Exp`
    of dt and A: the update stacks dt, not the [I, N] decay)."""
    I, N = h.shape
    y = (h * torch.exp(dt[:, None] * A)) @ C + u * (B * C).sum()
    return y, StateUpdate(Exp(dt, A), (Outer(u, B),), (I, N), ((I, 1), (I, 1), (1, N)))


def block_length(T: int) -> int:
    """The largest divisor of T that is <= SUB_CHUNK (the usual chunks, 8..512, are multiples)."""
    return max(c for c in range(1, min(T, SUB_CHUNK) + 1) if T % c == 0)


def _blocks(log_decay, u, valid_len):
    """(c, T/c, the log decays as [T/c, c, I*N], u [T, I]), padding rows' zeroed."""
    T = log_decay.shape[0]
    c = block_length(T)
    real = (torch.arange(T) < valid_len).to(u.dtype)
    return c, T // c, (log_decay * real.view(T, 1, 1)).view(T // c, c, -1), u * real.view(T, 1)


def chunk_pairwise(h0, log_decay, u, B, C, valid_len):
    """`chunk` as matmuls, in blocks of c = block_length(T) tokens.

    h0 [I, N] fp32; log_decay = dt A [T, I, N] (<= 0); u = dt x [T, I]; B, C [T, N]. With
    cum[t] the inclusive sum of log_decay over t's block up to t, and per block b (tokens t, s):

        y[t]   = C[t] . (exp(cum[t]) h_in[b] + sum_{s<=t} exp(cum[t] - cum[s]) u[s] B[s])
        Z[b]   = sum_s exp(cum[last] - cum[s]) u[s] B[s]       (the block's own contribution)
        h_in[b] = exp(G_<b) h0 + sum_{b'<b} exp(G_<b - G_<=b') Z[b']   (G: block totals summed)

    Every exponent is a sum of log decays, so <= 0: nothing overflows however fast the decay
    (a factorised exp(cum) exp(-cum) would). Memory is bounded by c, not by T: the pairwise
    decays are [T/c, c, c, I, N], the block-to-block ones [T/c, T/c, I, N]. Rows t >= valid_len
    are padding: their log_decay and u are zeroed, so they neither decay nor feed the state.
    Returns (h_T [I, N], y [T, I])."""
    T, I, N = log_decay.shape
    c, nb, a, u = _blocks(log_decay, u, valid_len)
    u = u.view(nb, c, I)
    B, C = B.view(nb, c, N), C.view(nb, c, N)
    up_to = torch.tril(torch.ones(c, c, dtype=u.dtype))
    cum = (up_to @ a).view(nb, c, I, N)  # prefix sums as matmuls, no cumsum op; no slices (slow here)
    # the log decay from each token to its block's end, and each block's total: sums of their own
    # terms, not differences of prefix sums (which lose the small to the large after a fast decay)
    rest = (up_to.t() - torch.eye(c, dtype=u.dtype)) @ a  # [nb, c, I*N]: sum over r > s
    total = torch.ones(1, c, dtype=u.dtype) @ a  # [nb, 1, I*N]
    # within a block: E[b, t, s] = exp(cum[t] - cum[s]), clamped at 0 above the diagonal
    # (exp(0) there, masked by CB: never inf * 0)
    E = torch.exp((cum.view(nb, c, 1, I, N) - cum.view(nb, 1, c, I, N)).clamp(max=0.0))
    CB = C.view(nb, c, 1, N) * B.view(nb, 1, c, N) * up_to.view(1, c, c, 1)
    M = (E.view(nb * c * c, I, N) @ CB.view(nb * c * c, N, 1)).view(nb, c, c, I)
    y = (M * u.view(nb, 1, c, I)).sum(2)  # [nb, c, I]
    Z = (torch.exp(rest.view(nb, c, I, N)) * (u.view(nb, c, I, 1) * B.view(nb, c, 1, N))).sum(1)  # [nb, I, N]
    # between blocks: the same pairwise form over the block totals
    before = torch.tril(torch.ones(nb, nb, dtype=u.dtype), -1)  # b' < b
    G_lt = (before @ total.view(nb, I * N)).view(nb, I, N)  # the totals of the blocks before b
    G_le = G_lt + total.view(nb, I, N)
    gaps = torch.exp((G_lt.view(nb, 1, I, N) - G_le.view(1, nb, I, N)).clamp(max=0.0)) * before.view(nb, nb, 1, 1)
    h_in = torch.exp(G_lt) * h0 + (gaps * Z.view(1, nb, I, N)).sum(1)  # [nb, I, N]
    y = y + ((torch.exp(cum) * h_in.view(nb, 1, I, N)).view(nb * c, I, N) @ C.view(nb * c, N, 1)).view(nb, c, I)
    after = (before.t() @ total.view(nb, I * N)).view(nb, I, N)  # the totals of the blocks after b
    G_all = (torch.ones(1, nb, dtype=u.dtype) @ total.view(nb, I * N)).view(I, N)
    h_T = torch.exp(G_all) * h0 + (torch.exp(after) * Z).sum(0)
    return h_T, y.reshape(T, I)


def scan_naive(h0, log_decay, u, B, C, valid_len: int):
    """The chunk token by token: (h_T, y [T, I]); padding rows leave h and give y = h . C."""
    h, ys = h0, []
    for t in range(log_decay.shape[0]):
        if t < valid_len:
            h = h * torch.exp(log_decay[t]) + u[t][:, None] * B[t][None, :]
        ys.append(h @ C[t])
    return h, torch.stack(ys)


def chunk(h0, log_decay, u, B, C, valid_len):
    """The scan over a chunk of T tokens with no loop op: c = block_length(T) steps, each on
    every block at once ([T/c, I, N], from a zero state), then T/c steps carrying the state from
    block to block, then each token's share of the carried state, C[t] . (exp(cum[t]) h_in[b]),
    cum the log decay summed within the block up to t (<= 0). Decays are only multiplied
    (all <= 1): nothing overflows however fast the decay. Work ~T*I*N per step set, c + T/c
    unrolled steps of a few ops each per layer (c = 8, T = 64: 16).

    h0 [I, N] fp32; log_decay = dt A [T, I, N]; u = dt x [T, I]; B, C [T, N]. Rows t >= valid_len
    are padding: their log_decay and u are zeroed, so they neither decay nor feed the state.
    Returns (h_T [I, N], y [T, I])."""
    T, I, N = log_decay.shape
    c, nb, a, u = _blocks(log_decay, u, valid_len)
    by_step = lambda x: x.reshape(nb, c, -1).transpose(0, 1).reshape(c, -1)  # noqa: E731  row j: step j of every block
    row = lambda x, j: F.embedding(torch.tensor([j]), x)  # noqa: E731  a row lookup (slices are slow here)
    decay, push, Cs = by_step(torch.exp(a)), by_step(u.view(T, I, 1) * B.view(T, 1, N)), by_step(C)
    h, ys = None, []
    for j in range(c):  # within every block at once, from a zero state
        b = row(push, j).view(nb, I, N)
        h = b if h is None else h * row(decay, j).view(nb, I, N) + b
        ys.append((h @ row(Cs, j).view(nb, N, 1)).view(nb, 1, I))
    Z, D = h.reshape(nb, I * N), torch.exp(torch.ones(1, c, dtype=u.dtype) @ a).view(nb, I * N)
    carried = [h0.reshape(1, I * N)]
    for b in range(nb):  # the state entering each block
        carried.append(carried[-1] * row(D, b) + row(Z, b))
    h_in = torch.cat(carried[:nb]).view(nb, 1, I, N)
    cum = (torch.tril(torch.ones(c, c, dtype=u.dtype)) @ a).view(nb, c, I, N)
    y = torch.cat(ys, 1) + ((torch.exp(cum) * h_in).view(T, I, N) @ C.view(T, N, 1)).view(nb, c, I)
    return carried[nb].view(I, N), y.reshape(T, I)
