"""(I + N)^-1 for a strictly lower triangular N: the solve of every WY chunk form (RWKV-7's
WKV, the gated delta rule), as matmuls only.

N is nilpotent (its T-th power is 0 for T x T), so (I + N)^-1 = (I - N)(I + N^2)(I + N^4)...
with ceil(log2 T) factors: exact in exact arithmetic, and only T x T matmuls, no triangular
solve. The caller passes -N, which its own products give directly.

Over a long chunk that product is unstable: the powers N^2, N^4, ... grow before they vanish
(RWKV-7's removal terms at T = 64: |N^16| reaches 4.5e3 where |N| is 0.45 and the inverse's
largest entry is 1), and the factors' product cancels them in fp32, leaving errors of 6e-3 in
the state. So a static T above BLOCK is solved in two levels: the product within diagonal
blocks of BLOCK tokens (where the powers stay small), then the same product over the blocks,
I + N = (I + N_D)(I + (I + N_D)^-1 N_E), N_D the diagonal blocks and N_E the rest, whose
second factor is nilpotent of degree ceil(T / BLOCK). Same number of matmuls as one level.
"""

from __future__ import annotations

import math

import torch


BLOCK = 16  # the diagonal blocks of the two-level solve (see the module docstring)


def unit_lower_inverse(minus_n: torch.Tensor, max_tokens: int | None = None) -> torch.Tensor:
    """(I + N)^-1 from minus_n = -N [..., T, T], N strictly lower triangular. A symbolic T (a
    dynamic-shape export) takes one level, with the factors of `max_tokens`."""
    T = minus_n.shape[-1]
    if max_tokens is not None or T <= BLOCK:
        return _power_product(minus_n, max_tokens or T)
    block = torch.arange(T) // BLOCK
    within = (block.view(-1, 1) == block.view(1, -1)).to(minus_n.dtype)
    minus_d = minus_n * within  # -N_D
    inverse_d = _power_product(minus_d, BLOCK)
    # (I + X_D N_E)^-1 from -(X_D N_E) = X_D (-N_E), strictly lower by whole blocks
    return _power_product(inverse_d @ (minus_n - minus_d), math.ceil(T / BLOCK)) @ inverse_d


def _power_product(minus_n: torch.Tensor, nilpotency: int) -> torch.Tensor:
    """(I - N)(I + N^2)(I + N^4)... up to the power `nilpotency` needs (N^nilpotency = 0)."""
    eye = torch.eye(minus_n.shape[-1], dtype=minus_n.dtype)
    inverse, power = eye + minus_n, minus_n
    for _ in range(max(0, math.ceil(math.log2(nilpotency)) - 1)):
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
