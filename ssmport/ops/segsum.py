"""The preamble of every chunkwise form (Mamba-2's SSD, the delta rule's WY form): per-head
prefix sums of the log decays over a chunk and the pairwise decays between its tokens.

For a chunk of T tokens with log decays a[t] (per head), cum[t] = a[0] + ... + a[t] and
D[t, s] = exp(cum[t] - cum[s]) for s <= t, 0 above the diagonal. Rows t >= valid_len are
padding: their log decay is zeroed (they do not decay the state), and `real` marks them so
the caller zeroes their inputs too.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class ChunkDecays(NamedTuple):
    real: torch.Tensor  # [T, 1]: 1 for tokens < valid_len, 0 for padding
    up_to: torch.Tensor  # [T, T]: up_to[t, s] = 1 if s <= t
    cum: torch.Tensor  # [H, T]: inclusive prefix sums of the (masked) log decays
    decay: torch.Tensor  # [H, T, T]: exp(cum[t] - cum[s]) for s <= t, else 0


def chunk_decays(log_decay: torch.Tensor, valid_len: torch.Tensor) -> ChunkDecays:
    """log_decay [T, H] (fp32), valid_len int32 [1]."""
    T, H = log_decay.shape
    dtype = log_decay.dtype
    real = (torch.arange(T) < valid_len).to(dtype).view(T, 1)
    up_to = torch.tril(torch.ones(T, T, dtype=dtype))
    cum = (up_to @ (log_decay * real)).t()  # the prefix sums as one matmul: no cumsum op needed
    gap = cum.view(H, T, 1) - cum.view(H, 1, T)
    decay = torch.exp(gap * up_to) * up_to  # exp(0) above the diagonal, then zeroed: never inf * 0
    return ChunkDecays(real, up_to, cum, decay)


def chunk_decays_naive(log_decay: torch.Tensor, valid_len: int) -> ChunkDecays:
    T, H = log_decay.shape
    real = torch.tensor([[1.0] if t < valid_len else [0.0] for t in range(T)], dtype=log_decay.dtype)
    cum = torch.cumsum(log_decay * real, dim=0).t()
    decay = torch.zeros(H, T, T, dtype=log_decay.dtype)
    for t in range(T):
        for s in range(t + 1):
            decay[:, t, s] = torch.exp(cum[:, t] - cum[:, s])
    return ChunkDecays(real, torch.tril(torch.ones(T, T, dtype=log_decay.dtype)), cum, decay)
