"""The depthwise causal short conv that Mamba-2 and Gated DeltaNet run before their
recurrences, over a carried state of past inputs, in the form this runtime runs fast.

Rows are time, oldest first. `past` [P, D] holds the last P inputs, `new` [T, D] the chunk's;
token t's window is the W rows ending at row P+t of [past; new], and the carried state after
the chunk is the P rows ending at its last real token. Every row pick is a product with a
0/1 selection matrix, which is exact (1*v plus zeros): on the Linux Core AI runtime the concat
and slices it replaces ran at a few MB/s (600 of a mamba2-130m prefill chunk's 1,500 ms, and
3 concats per layer of a Gated DeltaNet decode step; runtime Profiler).
"""

from __future__ import annotations

import torch


def causal_conv(past: torch.Tensor, new: torch.Tensor, weight: torch.Tensor, valid_len: torch.Tensor | None = None):
    """out[t] = sum_j weight[j] * row (P+t-W+1+j) of [past; new], for past [P, D], new [T, D],
    weight [W, D] (W <= P+1). Returns (out [T, D], the new past [P, D]: the P rows ending at
    token valid_len-1, or at the last token when valid_len is None)."""
    P, T, W = past.shape[0], new.shape[0], weight.shape[0]
    dtype = past.dtype

    def pick(rows: torch.Tensor) -> torch.Tensor:
        """Rows `rows` [R] of [past; new], as [R, D]."""
        from_past = (rows.view(-1, 1) == torch.arange(P).view(1, P)).to(dtype)
        from_new = (rows.view(-1, 1) == torch.arange(P, P + T).view(1, T)).to(dtype)
        return from_past @ past + from_new @ new

    taps = torch.arange(W).view(W, 1) + torch.arange(T).view(1, T) + (P - W + 1)  # [W, T]
    out = (pick(taps.reshape(-1)).view(W, T, -1) * weight.view(W, 1, -1)).sum(0)
    end = T if valid_len is None else valid_len.long()
    return out, pick(end + torch.arange(P))
