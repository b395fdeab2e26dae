"""An in-graph loop over a recurrence step, for the token count a prefill chunk holds."""

from __future__ import annotations

from collections.abc import Callable

import torch


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
    output (~10 us per iteration each on this runtime).

    `torch._higher_order_ops.while_loop` converts to one `coreai.while`: conversion time does
    not grow with T, unlike an unrolled Python loop (T=64: 507 s vs ~19 s measured). The loop
    counter is int64 on the torch side (index ops need it); the converter stores it as int32.
    """
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


def scan_naive(step, state, per_token, valid_len: int, out_shape, keep_row_dim: bool = False):
    T = per_token[0].shape[0]
    outputs = torch.zeros((T, *out_shape), dtype=state.dtype)
    for t in range(int(valid_len)):
        rows = [x[t : t + 1] if keep_row_dim else x[t] for x in per_token]
        state, y = step(state, *rows)
        outputs[t] = y.reshape(out_shape)
    return state, outputs
