"""(I + N)^-1 for a strictly lower triangular N: the solve of every WY chunk form (RWKV-7's
WKV, the gated delta rule), as matmuls only.

N is nilpotent (its T-th power is 0 for T x T), so (I + N)^-1 = (I - N)(I + N^2)(I + N^4)...
with ceil(log2 T) factors: exact in exact arithmetic, and only T x T matmuls, no triangular
solve. The caller passes -N, which its own products give directly.
"""

from __future__ import annotations

import math

import torch


def unit_lower_inverse(minus_n: torch.Tensor, max_tokens: int | None = None) -> torch.Tensor:
    """(I + N)^-1 from minus_n = -N [..., T, T], N strictly lower triangular. The factors are
    those of T, or of `max_tokens` when T is symbolic (a dynamic-shape export)."""
    T = minus_n.shape[-1]
    eye = torch.eye(T, dtype=minus_n.dtype)
    inverse, power = eye + minus_n, minus_n
    for _ in range(max(0, math.ceil(math.log2(max_tokens or T)) - 1)):
        power = power @ power
        inverse = inverse @ (eye + power)
    return inverse


def unit_lower_inverse_naive(minus_n: torch.Tensor) -> torch.Tensor:
    """The same by forward substitution, one row at a time (fp64)."""
    n = -minus_n.double()
    T = n.shape[-1]
    rows: list[torch.Tensor] = []
    for t in range(T):  # row t of X = (I + N)^-1: X[t] = e_t - sum_{s<t} N[t, s] X[s]
        row = torch.zeros(*n.shape[:-2], T, dtype=torch.float64)
        row[..., t] = 1.0
        for s in range(t):
            row = row - n[..., t, s : s + 1] * rows[s]
        rows.append(row)
    return torch.stack(rows, dim=-2).to(minus_n.dtype)
