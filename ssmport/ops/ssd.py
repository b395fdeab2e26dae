"""Mamba-2's SSM (state space duality), per head h of P channels with an N-dim state:

    S_h' = S_h * exp(dt_h A_h) + (dt_h x_h) B_g^T        y_h = S_h' C_g (+ D_h x_h, by the caller)

with B, C shared by the heads of group g = h // (H / G) (Dao & Gu, 2024)."""

from __future__ import annotations

import torch

from ssmport.ops.deferred import Outer, PerGroup, StateUpdate
from ssmport.ops.rows import repeat_groups
from ssmport.ops.segsum import chunk_decays


def naive_step(s, x, dt, A, B, C):
    """One head: s [P, N], x [P], dt and A scalars, B and C [N]. Returns (s', y [P])."""
    s = s * torch.exp(dt * A) + dt * torch.outer(x, B)
    return s, s @ C


def decode(S, decay, dtx, BC):
    """Decode's step from the old state, without forming S':

        S'·C = decay * (S·C) + dtx * (B·C)

    S [H,P,N] fp32; decay = exp(dt*A) [H]; dtx = dt*x [H,P]; BC [2,G,N] (B, C per group).
    Returns (y [H,P], the StateUpdate over the state's own [H, P, N], B repeated per head)."""
    H, P, N = S.shape
    G = BC.shape[1]
    B, C = BC[0], BC[1]
    # S.C as a product and a sum over N, not a matmul with one output column: this runtime's
    # batched matmul reads a [P, N] @ [N, 1] product 3.5-5x slower than the two elementwise ops
    # (benchmarks/ssd_readout.py: 2.67 vs 0.54 ms a layer at Nemotron-H-4B's widths).
    SC = (S.view(G, H // G, P, N) * C.view(G, 1, 1, N)).sum(-1)
    BdotC = (B * C).sum(-1).view(G, 1, 1)
    y = decay.view(G, H // G, 1) * SC + dtx.view(G, H // G, P) * BdotC
    update = StateUpdate(decay, (Outer(dtx, PerGroup(B, H // G)),), (H, P, N), ((H, 1, 1), (H, P, 1), (H, 1, N)))
    return y.view(H, P), update


def chunk(S0, log_decay, dtx, BC, valid_len):
    """The SSM over a chunk of T tokens in its chunkwise (SSD) form: matmuls, no loop.

    S0 [H,P,N] fp32; log_decay = dt*A [T,H]; dtx = dt*x [T,H,P]; BC [T,2,G,N]. With cum and
    D[t,s] = exp(cum[t] - cum[s]) from ssmport.ops.segsum:

        y[t]  = exp(cum[t]) * (S0 . C[t])  +  sum_{s<=t} D[t,s] (C[t].B[s]) dtx[s]
        S_T   = exp(cum[T-1]) * S0          +  sum_s D[T-1,s] dtx[s] (x) B[s]

    which unrolls the step exactly up to rounding. Rows t >= valid_len are padding: their
    log_decay and dtx are zeroed, so they neither decay nor feed the state (the step loop this
    replaced cost ~40 ms per token of a 130m prefill). Returns (S_T, y [T,H,P])."""
    H, P, N = S0.shape
    T, G = BC.shape[0], BC.shape[2]
    seg = chunk_decays(log_decay, valid_len)
    dtx = dtx * seg.real.view(T, 1, 1)
    cum, D = seg.cum, seg.decay
    B = repeat_groups(BC[:, 0].permute(1, 0, 2), 0, H // G)  # [H, T, N]
    C = repeat_groups(BC[:, 1].permute(1, 0, 2), 0, H // G)  # [H, T, N]
    xh = dtx.permute(1, 0, 2)  # [H, T, P]
    y = ((C @ B.transpose(1, 2)) * D) @ xh + torch.exp(cum).view(H, T, 1) * (C @ S0.transpose(1, 2))
    to_end = D[:, T - 1 : T, :].transpose(1, 2)  # [H, T, 1]: exp(cum[T-1] - cum[s])
    S = torch.exp(cum[:, T - 1 : T]).view(H, 1, 1) * S0 + (xh * to_end).transpose(1, 2) @ B  # slices: T may be symbolic
    return S, y.permute(1, 0, 2).contiguous()
