"""Chunked prefill: the shared pieces every architecture's `prefill` function is built from.

A bundle may carry a second function, `prefill`, beside the M=1 decode function `main`, in
the same asset (the converter stores the weights the two share once). It ingests a fixed
chunk of T prompt tokens per call:

    prefill(input_ids int32 [1,T], position_ids int32 [1,T], valid_len int32 [1]) -> logits [1,1,V]

and reads and writes the same named states as `main`, each exactly once per call.

A short final chunk is padded, not given its own graph: tokens at t >= valid_len are
padding. The recurrence runs `valid_len` steps inside the graph (a `while_loop` whose trip
count is the input), so padding never touches a state, and the logits are those of token
valid_len-1. Everything that is not the recurrence (projections, norms, MLPs) is batched
over all T rows; the padded rows are computed and thrown away. 1 <= valid_len <= T.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads on first use: the CLI imports this module for DEFAULT_CHUNK
    import torch

PREFILL_FUNCTION = "prefill"
PREFILL_INPUT_NAMES = ("input_ids", "position_ids", "valid_len")
DEFAULT_CHUNK = 64


def example_inputs(chunk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tracing inputs of the prefill signature (values are irrelevant to the graph)."""
    import torch

    return (
        torch.zeros(1, chunk, dtype=torch.int32),
        torch.zeros(1, chunk, dtype=torch.int32),
        torch.full((1,), chunk, dtype=torch.int32),
    )


def last_valid(rows: torch.Tensor, valid_len: torch.Tensor) -> torch.Tensor:
    """Row valid_len-1 of `rows` [T, ...], as [1, ...] (the last real token of the chunk)."""
    return rows.index_select(0, valid_len.long() - 1)


def scan(
    step: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    state: torch.Tensor,
    per_token: tuple[torch.Tensor, ...],
    valid_len: torch.Tensor,
    out_shape: tuple[int, ...],
    keep_row_dim: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run `state, y = step(state, *row_t)` for t in [0, valid_len) as one in-graph loop.

    `per_token` tensors are [T, ...] (row t is token t's input); the outputs y are gathered
    into [T, *out_shape] (rows >= valid_len stay zero). Returns (final state, outputs).
    With `keep_row_dim` the step gets each row as [1, ...] and returns y as [1, *out_shape]:
    inputs shaped for broadcasting up front spare the loop body a reshape per input and per
    output, and on this runtime a reshape inside the loop costs ~10 us per iteration each.

    `torch._higher_order_ops.while_loop` converts to one `coreai.while`: conversion time
    does not grow with T, unlike an unrolled Python loop (T=64: 507 s vs ~19 s measured).
    The loop counter is int64 on the torch side (index ops need it); the converter stores
    it as int32.
    """
    import torch
    from torch._higher_order_ops import while_loop

    T = per_token[0].shape[0]

    def cond(t, s, ys):
        return t[0] < valid_len[0]

    def body(t, s, ys):
        if keep_row_dim:
            s, y = step(s, *(x.index_select(0, t) for x in per_token))
            return t + 1, s, ys.index_copy(0, t, y)
        s, y = step(s, *(x.index_select(0, t)[0] for x in per_token))
        return t + 1, s, ys.index_copy(0, t, y.unsqueeze(0))

    start = torch.zeros(1, dtype=torch.int64)
    outputs = torch.zeros((T, *out_shape), dtype=state.dtype)
    _, state, outputs = while_loop(cond, body, (start, state, outputs))
    return state, outputs
