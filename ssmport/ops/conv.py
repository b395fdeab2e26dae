"""The depthwise causal short conv that Mamba-2, Gated DeltaNet, LFM2 and the hybrids run
before their recurrences, over a carried state of past inputs.

Rows are time, oldest first. `past` [P, D] holds the last P inputs, `new` [T, D] the chunk's;
token t's window is the W rows ending at row P+t of [past; new], and the carried state after
the chunk is the P rows ending at its last real token. Every row pick is a 0/1 selection
matmul (`select_rows`): the concat and slices it replaces ran at a few MB/s here (600 of a
mamba2-130m prefill chunk's 1,500 ms; runtime Profiler).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ssmport.ops.rows import select_rows


class ShiftIn(NamedTuple):
    """A decode step's new past, deferred: the old past shifted up one row, `row` [1, D] its
    newest. `shift_in` writes every layer's at once from the stacked state, so a layer computes
    no new past and the write stacks one row a layer, not P: the stack is a concat, which runs
    at ~0.2 GB/s here (3 x [4, 11520] fp32: 2.7 ms against 0.33 ms for the same bytes moved by
    multiply-adds; OLMo-Hybrid-7B's first 4 layers spent 2.5 ms a call on it)."""

    row: torch.Tensor


def causal_conv(past: torch.Tensor, new: torch.Tensor, weight: torch.Tensor, valid_len: torch.Tensor | None = None):
    """out[t] = sum_j weight[j] * row (P+t-W+1+j) of [past; new], for past [P, D], new [T, D],
    weight [W, D] (W <= P+1). Returns (out [T, D], the new past: the P rows ending at token
    valid_len-1 [P, D]; for a decode step (valid_len None, one row), a `ShiftIn`)."""
    P, T, W = past.shape[0], new.shape[0], weight.shape[0]
    taps = torch.arange(W).view(W, 1) + torch.arange(T).view(1, T) + (P - W + 1)  # [W, T]
    out = (select_rows([past, new], taps.reshape(-1)).view(W, T, -1) * weight.view(W, 1, -1)).sum(0)
    if valid_len is None and isinstance(T, int) and T == 1:
        return out, ShiftIn(new)
    end = T if valid_len is None else valid_len.long()
    return out, select_rows([past, new], end + torch.arange(P))


def shift_in(buffer: torch.Tensor, rows: list[torch.Tensor]) -> None:
    """Write every layer's `ShiftIn` into the stacked past [L, (1,) P, D] at once: each layer's
    past shifted up one row by a 0/1 matmul, its new row added as the last one through a 0/1
    column, both exact (1*v plus zeros); one write."""
    L, P, D = buffer.shape[0], buffer.shape[-2], buffer.shape[-1]
    shift = (torch.arange(P).view(P, 1) + 1 == torch.arange(P).view(1, P)).to(torch.float32)  # row i takes i+1
    newest = (torch.arange(P) == P - 1).to(torch.float32).view(P, 1)
    # [P, P] and [P, 1] broadcast against the buffer's own shape, so only the stacked rows are
    # reshaped (graph_diff.py: 2 reshapes, a matmul, a multiply and an add a call)
    new = torch.cat(rows).view(L, *([1] * (buffer.dim() - 2)), D)  # the rows [1, D] stacked: one concat
    buffer.copy_((shift @ buffer.float() + newest * new).to(buffer.dtype))


def shift_in_naive(buffer: torch.Tensor, rows: list[torch.Tensor]) -> None:
    L, P, D = buffer.shape[0], buffer.shape[-2], buffer.shape[-1]
    past = buffer.view(L, P, D)
    buffer.copy_(torch.cat([past[:, 1:], torch.stack([r.reshape(1, D) for r in rows]).to(buffer.dtype)], 1).view(buffer.shape))


def causal_conv_naive(past: torch.Tensor, new: torch.Tensor, weight: torch.Tensor, valid_len: int | None = None):
    P, T, W = past.shape[0], new.shape[0], weight.shape[0]
    rows = torch.cat([past, new])
    out = torch.stack([(rows[P + t - W + 1 : P + t + 1] * weight).sum(0) for t in range(T)])
    end = T if valid_len is None else int(valid_len)
    return out, rows[end : end + P]
