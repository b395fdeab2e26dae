"""The depthwise causal short conv that Mamba-2, Gated DeltaNet, LFM2 and the hybrids run
before their recurrences, over a carried state of past inputs.

Rows are time, oldest first. `past` [P, D] holds the last P inputs, `new` [T, D] the chunk's;
token t's window is the W rows ending at row P+t of [past; new], and the carried state after
the chunk is the P rows ending at its last real token. Every row pick is a 0/1 selection
matmul (`select_rows`): the concat and slices it replaces ran at a few MB/s here (600 of a
mamba2-130m prefill chunk's 1,500 ms; runtime Profiler).
"""

from __future__ import annotations

import torch

from ssmport.ops.rows import select_rows


def causal_conv(past: torch.Tensor, new: torch.Tensor, weight: torch.Tensor, valid_len: torch.Tensor | None = None):
    """out[t] = sum_j weight[j] * row (P+t-W+1+j) of [past; new], for past [P, D], new [T, D],
    weight [W, D] (W <= P+1). Returns (out [T, D], the new past [P, D]: the P rows ending at
    token valid_len-1, or at the last token when valid_len is None)."""
    P, T, W = past.shape[0], new.shape[0], weight.shape[0]
    taps = torch.arange(W).view(W, 1) + torch.arange(T).view(1, T) + (P - W + 1)  # [W, T]
    out = (select_rows([past, new], taps.reshape(-1)).view(W, T, -1) * weight.view(W, 1, -1)).sum(0)
    end = T if valid_len is None else valid_len.long()
    return out, select_rows([past, new], end + torch.arange(P))


def causal_conv_naive(past: torch.Tensor, new: torch.Tensor, weight: torch.Tensor, valid_len: int | None = None):
    P, T, W = past.shape[0], new.shape[0], weight.shape[0]
    rows = torch.cat([past, new])
    out = torch.stack([(rows[P + t - W + 1 : P + t + 1] * weight).sum(0) for t in range(T)])
    end = T if valid_len is None else int(valid_len)
    return out, rows[end : end + P]
