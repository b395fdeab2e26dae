"""RWKV-7's WKV recurrence, per head, with S the [K, V] matrix state (key-major, fla's layout):

    S' = diag(w) S - (kk * a) (kk^T S) + k v^T          y = r^T S'

w the per-key decay, kk the unit "removal key", a the in-context learning rate (BlinkDL's
`RWKV_x070`, fla's `chunk_rwkv7`)."""

from __future__ import annotations

import torch

from ssmport.ops.deferred import Outer, StateUpdate


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


def decode(S, r, decay, kk, kka, k, v):
    """Decode's step from the old state, without forming S' (the graph applies every layer's
    update to the whole state at once, ssmport.ops.deferred):

        r^T S' = (r*decay)^T S - (r.(kk*a)) (kk^T S) + (r.k) v^T

    S [H,N,Nv] fp32; r, decay, kk, kka = kk*a, k [H,N]; v [H,Nv]. Returns (y [H,Nv], the
    StateUpdate over the [H, N, Nv] view)."""
    H, N, Nv = S.shape
    kk_S = (kk.view(H, 1, N) @ S).view(H, Nv)
    y = (
        ((r * decay).view(H, 1, N) @ S).view(H, Nv)
        - (r * kka).sum(dim=-1, keepdim=True) * kk_S
        + (r * k).sum(dim=-1, keepdim=True) * v
    )
    col, row = (H, N, 1), (H, 1, Nv)
    update = StateUpdate(decay, (Outer(kka, kk_S, minus=True), Outer(k, v)), (H, N, Nv), (col, col, row, col, row))
    return y, update
