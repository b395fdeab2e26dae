"""Sliding-window attention over a ring buffer: a cache of constant size, whatever the context.

Window W, transformers' semantics (`masking_utils.sliding_window_overlay`: kv_idx > q_idx - W):
the token at position p attends to positions p-W+1 .. p, W keys with its own. A layer's ring
K, V [KVH, W, d] holds in slot j the latest position q = j (mod W) written so far: W slots
are exactly enough, since the slot a token writes held position p-W, the first one it no longer
sees. RoPE is applied to K before the write, so the slot order does not change the scores; a
mask built in the graph from the call's positions marks the slots that hold a written
position inside each token's window (zeros never written are masked, so nothing is cleared).

A call writes each state once (ssmport.graph): every layer's new rows at their slots in one
`index_copy` (`write`), or, where the token count or the ring's size is dynamic, in one blend
over the ring's slots (`blend`).

A growing ring (ssmport.growing_kv, the default layout): the runner allocates S <= W slots as it
does a KV cache's positions (256, doubled, capped at W: ssmport.runtime.kv_growth), so a call
reads and writes the slots the tokens need, not W. While S < W nothing has wrapped (the
runner grows S before a call would write position S), so slot j of the S held is slot j of
the whole ring: the slot arithmetic keeps the constant W (`window`), and the masks and the
blend cover the S slots allocated. `window` None: the ring is whole (W = its size). A prefill chunk may be longer than W: its tokens attend to each other under a
band mask, and only its last min(T, W) real rows are written (consecutive positions, so
distinct slots), so the final ring is the one the M=1 loop leaves (tests/test_ring_state.py).

The slot p mod W is computed as p - W floor(p / W) from a float floor and two corrections:
this runtime has no lowering for `aten.remainder` (measured: "unsupported ATen ops:
aten.remainder.Scalar"), and a float floor and `where` are ops every backend has.
"""

from __future__ import annotations

import torch

from ssmport.ops import attention
from ssmport.ops.rows import blend_at, stack_rows


def ring_slot(positions: torch.Tensor, window: int) -> torch.Tensor:
    """positions mod window (int32, in [0, window), negatives included), without `remainder`.
    The float quotient may be one off for large positions; the integer corrections make the
    result exact for |position| < 2^22 * window (4M positions even at window 1)."""
    p = positions.to(torch.int32)
    r = p - torch.floor(p.float() * (1.0 / window)).to(torch.int32) * window
    r = torch.where(r < 0, r + window, r)
    return torch.where(r >= window, r - window, r)


def slot_positions(start: torch.Tensor, window: int, slots: int | None = None) -> torch.Tensor:
    """int32 [slots]: the position slot j (of the first `slots`, default all W) holds before a
    call whose first token is at `start` [1]: the latest q < start with q = j (mod W); negative
    where nothing was written yet."""
    last = start.to(torch.int32) - 1
    return last - ring_slot(last - torch.arange(window if slots is None else slots, dtype=torch.int32), window)


def decode(q, k, v, K, V, position, scale: float, window: int | None = None):
    """One token at `position` [1]: q [H, d]; its k, v [KVH, d]; the ring K, V [KVH, S, d] (S
    slots of a window of `window`, default S) before this token's write. It attends to the slots
    holding positions in [position-W+1, position-1] and to itself. Returns o [H, d].

    Slot j holds such a position exactly when j < position (written) and j is not the slot this
    token overwrites (it holds position-W): two comparisons over the slots and one ring_slot of
    a scalar, where `slot_positions` runs the slot arithmetic over every slot (a dozen ops on a
    dynamic shape in a growing ring: benchmarks/README.md, "A ring's decode cost")."""
    W = window or K.shape[1]
    p = position.to(torch.int32)
    slots = torch.arange(K.shape[1], dtype=torch.int32)
    past = (slots < p) & (slots != ring_slot(p, W))
    return attention.decode(q, k, v, K, V, position, scale, past=past)


def chunk(q, k, v, K, V, start, scale: float, window: int | None = None):
    """T tokens at positions start .. start+T-1 (T may exceed W): q [T, H, d]; their k, v
    [T, KVH, d]; the ring K, V [KVH, S, d] (S slots of a window of `window`, default S) before
    the call. Token t attends to the ring slots holding positions in [start+t-W+1, start-1] and
    to the chunk's rows s with t-W < s <= t. Padding rows are never attended to by real rows
    (s <= t). Returns o [T, H, d]."""
    T, W = q.shape[0], window or K.shape[1]
    held = slot_positions(start, W, K.shape[1]).view(1, -1)
    first_seen = start.to(torch.int32) + torch.arange(T, dtype=torch.int32).view(T, 1) - W  # [T, 1]
    past = (held >= 0) & (held > first_seen)  # [T, S]
    band = torch.tril(torch.ones(T, T, dtype=torch.bool)) & torch.triu(torch.ones(T, T, dtype=torch.bool), 1 - W)
    return attention.chunk(q, k, v, K, V, start, scale, past=past, causal=band)


def write(buffer: torch.Tensor, rows: list[torch.Tensor], positions: torch.Tensor, valid_len: torch.Tensor | None) -> None:
    """Scatter every layer's new rows [heads, T, d] into the ring [L, 1, heads, W, d] at slot
    position mod W, in one `index_copy`. Only a chunk's last min(T, W) real rows are written
    (rows before them would be overwritten in the same call, and duplicate indices with
    different values would leave the result to the backend); while fewer than that are real,
    the first real row stands in for the missing ones, written twice with the same value."""
    L, _, heads, W, d = buffer.shape
    T = rows[0].shape[1]
    stacked = stack_rows(rows).view(L, 1, heads, T, d)
    if valid_len is None:
        source = torch.arange(T)  # decode: T = 1
    else:
        n = min(T, W)
        source = (valid_len.long() - n + torch.arange(n)).clamp(min=0)
        stacked = stacked.index_select(3, source)
    where = ring_slot(positions.index_select(0, source), W).long()
    buffer.index_copy_(3, where, stacked.to(buffer.dtype))


def blend(buffer: torch.Tensor, rows: list[torch.Tensor], positions: torch.Tensor, valid_len: torch.Tensor | None,
          window: int | None = None) -> None:  # fmt: skip
    """`write` without a scatter, for a call whose token count T or ring size S is dynamic (the
    converter refuses `index_copy` when its index count or axis is not static): every layer's
    new rows [heads, T, d] blended into the ring [L, 1, heads, S, d] of a window of `window`
    (default S; ssmport.ops.rows.blend_at). Slot j takes the chunk's row holding the latest
    position = j (mod W) below the call's end, if that position is the call's; so a chunk
    longer than W leaves its last W rows, and the ring ends as `write` leaves it. The blend
    covers the ring's S slots, whatever T."""
    S = buffer.shape[3]
    W = window or S
    if valid_len is None:  # decode: T = 1
        blend_at(buffer, rows, torch.arange(S, dtype=torch.int32) == ring_slot(positions.view(1), W), None)
        return
    start = positions[0:1].to(torch.int32)
    offset = slot_positions(start + valid_len.to(torch.int32), W, S) - start  # [S]: the row landing in each slot
    blend_at(buffer, rows, offset >= 0, offset.long())


def write_naive(ring: torch.Tensor, rows: torch.Tensor, positions: list[int]) -> None:
    """The readable twin of `write` for one layer: ring [heads, W, d]; each real row [heads, n, d]
    at slot position % W, in order."""
    for t, p in enumerate(positions):
        ring[:, p % ring.shape[1]] = rows[:, t]


def naive(q, k, v, K_past, V_past, window: int, scale: float | None = None):
    """The readable form for one token: attention over its last W-1 earlier keys (K_past
    [n, KVH, d], every earlier token's) and itself."""
    keep = max(K_past.shape[0] - (window - 1), 0)
    return attention.naive(q, k, v, K_past[keep:], V_past[keep:], scale)
