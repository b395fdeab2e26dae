"""Moving rows: reading a layer's slice of a stacked state, stacking small per-layer rows,
picking rows of a chunk, the token shift, and writing a state once.

On the Linux Core AI runtime `slice`, `concat` and `index_select` run at a few MB/s while a
row lookup (`embedding` -> `gather_nd`), a scatter (`index_copy` -> `scatter_nd`) and a 0/1
selection matmul run at memory speed (benchmarks/state_io.py, benchmarks/profile_ops.py). So
every row move here is one of those three, except `stack_rows`: its small rows are one concat,
since a scatter per layer costs a GPU a dispatch per layer for a few percent here. Each has a
naive twin written with indexing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def read_layer(buffer: torch.Tensor, i: int, flat: bool = False) -> torch.Tensor:
    """Layer i's slice `buffer[i]` of a stacked [L, ...] state, as a gather of index i on the
    state in its own shape (a slice or `index_select` is 6-15x slower here for the same bytes).

    `flat`: a row lookup on the [L, rest] view instead. That view is a reshape of the whole
    state, which this runtime copies (3.3 ms a decode call at gated-deltanet-340m), so decode
    reads flat only a state whose readers the converter would otherwise widen: it keeps the
    gathered slice's unit axes on every tensor computed from it, then reshapes each back
    (RWKV-7's recState: 2L - 2 more reshapes a call). A prefill chunk reads every state flat
    (the chunk forms cost a reshape a layer the other way). benchmarks/README.md, "A layer's
    state slice read in place"."""
    if flat:
        return F.embedding(torch.tensor([i]), buffer.reshape(buffer.shape[0], -1)).view(buffer.shape[1:])
    return buffer[torch.tensor([i])].view(buffer.shape[1:])


def read_layer_naive(buffer: torch.Tensor, i: int) -> torch.Tensor:
    return buffer[i]


def read_layer_by_matmul(buffer: torch.Tensor, i: int) -> torch.Tensor:
    """Layer i's slice as `onehot(i) @ buffer.view(L, -1)`: exact, and cheaper than
    `read_layer` only while a per-layer slice is large and L small (no built-in uses it;
    benchmarks/gdn_composite.py measured both)."""
    layers = buffer.shape[0]
    onehot = torch.zeros(1, layers, dtype=buffer.dtype)
    onehot[0, i] = 1
    return (onehot @ buffer.reshape(layers, -1)).view(buffer.shape[1:])


def stack_rows(pieces: list[torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Stack L tensors of equal size as the rows of an [L, numel] tensor: one concat, one
    dispatch on a GPU. (A chain of L `index_copy` scatters into zeros was ~7% faster per
    mamba2-130m decode step on the Linux runtime, but dispatched 92 more kernels per call:
    benchmarks/stack_rows_ab.py, benchmarks/README.md.) For small rows; a big state is updated
    as a whole instead (ssmport.ops.deferred).

    Pieces of one shape are concatenated as they are and the stack reshaped once: a reshape of
    each piece to a row is an op per piece here (RWKV-7's head-shaped update vectors: two a layer)."""
    if pieces[0].dim() > 0 and all(p.shape == pieces[0].shape for p in pieces):
        return torch.cat([p.to(dtype) for p in pieces]).reshape(len(pieces), -1)
    return torch.cat([p.reshape(1, -1).to(dtype) for p in pieces])


def stack_rows_naive(pieces: list[torch.Tensor], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.stack([p.reshape(-1).to(dtype) for p in pieces])


def write_once(buffer: torch.Tensor, per_layer: list[torch.Tensor]) -> None:
    """Write a stacked [L, ...] state from its L layer slices with a single in-place copy:
    exactly one `write_handle` per state in the exported graph (Apple's GPU delegate keeps
    one write per handle), and far cheaper here than writing slices in place."""
    buffer.copy_(stack_rows(per_layer, buffer.dtype).view(buffer.shape))


def blend_at(cache: torch.Tensor, rows: list[torch.Tensor], hit: torch.Tensor, offset: torch.Tensor | None) -> None:
    """Every layer's new rows [heads, T, d] into the stacked cache [L, 1, heads, S, d] at the
    S positions where `hit` (bool [S]) holds: position s takes row `offset[s]` (int [S]; where
    not hit, any value: it is clamped to the rows; None: T = 1, the one row), blended in over the whole cache as
    cache * (1 - hit) + new * hit with a 0/1 `hit`: exact for finite values, and broadcasting
    multiplies and an add, where `where` on a dynamic shape materialises its broadcasts
    (`broadcast_to`) and ran ~30x slower per byte here, and where a scatter (`index_copy`) on
    an axis whose length or index count is dynamic is refused by the converter. One write.
    The rows are looked up per position (a gather, memory speed here)."""
    L, _, heads, S, d = cache.shape
    hit = hit.to(cache.dtype).view(1, 1, 1, S, 1)
    if offset is None:
        new = torch.stack([r.view(heads, d) for r in rows]).view(L, 1, heads, 1, d).to(cache.dtype)
    else:
        T = rows[0].shape[1]
        table = torch.cat([r.transpose(0, 1).reshape(T, heads * d) for r in rows], dim=1)
        landed = F.embedding(offset.clamp(0, T - 1), table).view(S, L, 1, heads, d)
        new = landed.permute(1, 2, 3, 0, 4).to(cache.dtype)
    cache.copy_(cache * (1 - hit) + new * hit)


def blend_at_naive(cache: torch.Tensor, rows: list[torch.Tensor], hit: torch.Tensor, offset: torch.Tensor | None) -> None:
    """The readable form: layer l's row offset[s] into cache[l, 0, :, s] where hit[s]."""
    for layer, r in enumerate(rows):
        for s in range(cache.shape[3]):
            if hit[s]:
                cache[layer, 0, :, s] = r[:, 0 if offset is None else int(offset[s])].to(cache.dtype)


def repeat_groups(x: torch.Tensor, axis: int, times: int) -> torch.Tensor:
    """x with each index along `axis` repeated `times` times in a row ([.., G, ..] -> [.., G*times,
    ..]): a group's vector for each head of the group (Mamba-2's B and C, grouped q/k). A
    broadcast and one reshape, where `repeat_interleave` may gather."""
    shape = x.shape
    wide = x.unsqueeze(axis + 1).expand(*shape[: axis + 1], times, *shape[axis + 1 :])
    return wide.reshape(*shape[:axis], shape[axis] * times, *shape[axis + 1 :])


def repeat_groups_naive(x: torch.Tensor, axis: int, times: int) -> torch.Tensor:
    return x.repeat_interleave(times, dim=axis)


def select_rows(sources: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """Rows `rows` [R] of the row-wise concatenation of `sources` (each [n_i, D]), as [R, D],
    without forming the concatenation: a 0/1 selection matmul per source, which is exact
    (1*v plus zeros)."""
    out, first = None, 0
    for src in sources:
        n = src.shape[0]
        pick = (rows.unsqueeze(1) == torch.arange(first, first + n).unsqueeze(0)).to(src.dtype) @ src
        out = pick if out is None else out + pick
        first += n
    return out


def select_rows_naive(sources: list[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    return torch.cat(sources)[rows.long()]


def token_shift(rows: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    """Each row's predecessor: [previous; rows[:-1]] for rows [T, C], previous [1, C] (a decode
    step's one row needs no shift: its predecessor is `previous`).

    A row lookup of rows t-1 with row 0 replaced by `previous` through a 0/1 mask, which is exact (the slice + concat it replaces cost ~1.2 ms per call at T=64, C=768; a
    T x T shift matrix would be a constant the asset stores)."""
    T = rows.shape[0]
    earlier = torch.arange(T).clamp(min=1) - 1  # row 0 looks up row 0; the mask drops it
    first = (torch.arange(T) == 0).to(rows.dtype).view(T, 1)
    return F.embedding(earlier, rows) * (1 - first) + first * previous.float()


def token_shift_naive(rows: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
    return torch.cat([previous.float(), rows[:-1]])


def last_valid(rows: torch.Tensor, valid_len: torch.Tensor) -> torch.Tensor:
    """Row valid_len-1 of `rows` [T, ...], as [1, ...] (the last real token of a chunk)."""
    return rows.index_select(0, valid_len.long() - 1)


def last_valid_naive(rows: torch.Tensor, valid_len: torch.Tensor) -> torch.Tensor:
    n = int(valid_len[0])
    return rows[n - 1 : n]
