"""Causal softmax attention over a positional KV cache, and rotary position embeddings.

The cache of one layer holds K and V rows [kv_heads, context, head_dim] at their positions;
positions >= the current one hold stale values and are masked, so nothing has to be cleared.
A call attends over the cached past and over its own new rows, merged with one running
maximum (the softmax over [past; new] without concatenating them: concat is slow here), and
returns the new rows for the graph to write into the cache once (ssmport.graph).

GQA: query head h reads kv head h // (heads / kv_heads), as transformers' `repeat_kv`.
"""

from __future__ import annotations

import torch

from ssmport.ops import composite

NEG_INF = float("-inf")


def decode(q, k, v, K, V, position, scale: float, past=None):
    """One token: q [H, d]; its k, v [KVH, d]; the cache K, V [KVH, C, d]; position int [1]
    (this token's; cache rows < position are its past). `past`: bool [C], the cache rows it
    attends to, when not those (a sliding window's ring: ssmport.ops.sliding). Returns o [H, d]."""
    H, d = q.shape
    KVH, C = K.shape[0], K.shape[1]
    if composite.enabled("sdpa"):  # the cache and the new row as one key set, the new row last
        mask = torch.cat([torch.arange(C) < position if past is None else past, torch.ones(1, dtype=torch.bool)])
        keys, values = torch.cat([K, k.view(KVH, 1, d)], 1), torch.cat([V, v.view(KVH, 1, d)], 1)
        return composite.sdpa(q.view(1, H, d), keys, values, mask.view(1, C + 1), scale).view(H, d)
    qg = q.view(KVH, H // KVH, d)
    past = (torch.arange(C) < position if past is None else past).view(1, 1, C)
    # K q^T, then the small [C, rep] result transposed: q K^T transposes the whole cache slice
    # (runtime Profiler, a 0.8B-wide layer at context 4096: 20.6 ms for that transpose, 6.9 ms
    # for K q^T; other arrangements measured no faster).
    s_past = torch.where(past, (K @ qg.transpose(1, 2)).transpose(1, 2) * scale, NEG_INF)  # [KVH, rep, C]
    s_new = (qg * k.view(KVH, 1, d)).sum(-1, keepdim=True) * scale  # [KVH, rep, 1]
    top = torch.maximum(s_past.amax(-1, keepdim=True), s_new)
    p_past, p_new = torch.exp(s_past - top), torch.exp(s_new - top)
    o = (p_past @ V + p_new * v.view(KVH, 1, d)) / (p_past.sum(-1, keepdim=True) + p_new)
    return o.view(H, d)


def chunk(q, k, v, K, V, start, scale: float, past=None, causal=None):
    """T tokens at positions start .. start+T-1: q [T, H, d]; their k, v [T, KVH, d]; the cache
    K, V [KVH, C, d] (rows < start are the past). Token t attends over the past and over the
    chunk's rows s <= t. Padding rows (t >= valid_len) compute values nobody reads, and real
    rows never attend to them (s <= t). A sliding window (ssmport.ops.sliding) passes its own
    masks: `past` bool [T, C] (the cache rows token t attends to), `causal` bool [T, T] (the
    chunk's rows). Returns o [T, H, d]."""
    T, H, d = q.shape
    KVH, C = K.shape[0], K.shape[1]
    if composite.enabled("sdpa"):  # the cache and the chunk's rows as one key set
        past = (torch.arange(C) < start).view(1, C).expand(T, C) if past is None else past
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool)) if causal is None else causal
        keys, values = torch.cat([K, k.permute(1, 0, 2)], 1), torch.cat([V, v.permute(1, 0, 2)], 1)
        return composite.sdpa(q, keys, values, torch.cat([past, causal], 1), scale)
    rep = H // KVH
    qg = q.permute(1, 0, 2).reshape(KVH, rep * T, d)  # row r*T + t: query head kv*rep + r, token t
    kc, vc = k.permute(1, 0, 2), v.permute(1, 0, 2)  # [KVH, T, d]
    past = (torch.arange(C) < start).view(1, 1, C) if past is None else past.repeat(rep, 1).view(1, rep * T, C)
    s_past = torch.where(past, (qg @ K.transpose(1, 2)) * scale, NEG_INF)  # [KVH, rep*T, C]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool)) if causal is None else causal
    causal = causal.repeat(rep, 1).view(1, rep * T, T)
    s_new = torch.where(causal, (qg @ kc.transpose(1, 2)) * scale, NEG_INF)  # [KVH, rep*T, T]
    top = torch.maximum(s_past.amax(-1, keepdim=True), s_new.amax(-1, keepdim=True))
    p_past, p_new = torch.exp(s_past - top), torch.exp(s_new - top)
    o = (p_past @ V + p_new @ vc) / (p_past.sum(-1, keepdim=True) + p_new.sum(-1, keepdim=True))
    return o.view(KVH, rep, T, d).permute(2, 0, 1, 3).reshape(T, H, d)


def naive(q, k, v, K_past, V_past, scale: float | None = None):
    """The readable form for one token: q [H, d] attends over [K_past; k] (K_past [n, KVH, d]
    rows of earlier tokens, k [KVH, d]), scaled by `scale` (None: d^-0.5). Returns o [H, d]."""
    H, d = q.shape
    keys = torch.cat([K_past, k[None]])  # [n+1, KVH, d]
    values = torch.cat([V_past, v[None]])
    rep = H // k.shape[0]
    out = torch.empty(H, d)
    for h in range(H):
        scores = keys[:, h // rep] @ q[h]
        weights = torch.softmax(scores / d**0.5 if scale is None else scores * scale, dim=0)
        out[h] = weights @ values[:, h // rep]
    return out


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, d] of positions [T] for the per-dim frequencies `inv_freq_full` [d]
    (frequency 0 on dims that do not rotate: cos 1, sin 0, so they pass through exactly)."""
    angles = positions.float().view(-1, 1) * inv_freq.view(1, -1)
    return torch.cos(angles), torch.sin(angles)


def rotate(q, k, positions, inv_freq, rotate_half, pairs: int):
    """RoPE on q [T, H, d] and k [T, KVH, d] at positions [T]: the tables once, then
    `apply_rotary` to each; with the rope composite chosen (ssmport.ops.composite), coreai-torch's
    RoPE on dims i, i + pairs (i < pairs). Returns (q, k)."""
    if composite.enabled("rope"):
        return composite.rope(q, positions, inv_freq, pairs), composite.rope(k, positions, inv_freq, pairs)
    cos, sin = rotary_tables(positions, inv_freq)
    return apply_rotary(q, cos, sin, rotate_half), apply_rotary(k, cos, sin, rotate_half)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotate_half: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin for x [T, heads, d], cos/sin [T, d], with rotate_half a
    constant 0/±1 [d, d] matrix: the half rotation as one exact matmul instead of two slices and
    a concat (slow here), which also covers partial rotary (zero rows and columns)."""
    T, heads, d = x.shape
    turned = (x.reshape(T * heads, d) @ rotate_half).view(T, heads, d)
    return x * cos.view(T, 1, d) + turned * sin.view(T, 1, d)


def rotate_half_matrix(d: int, rotary_dim: int) -> torch.Tensor:
    """R with x @ R = [-x2, x1, 0...] for x = [x1, x2, rest], x1 and x2 of rotary_dim/2 each
    (the rotate-half convention of Llama, Qwen and transformers)."""
    half = rotary_dim // 2
    R = torch.zeros(d, d)
    for i in range(half):
        R[half + i, i] = -1.0  # out[i] = -x2[i]
        R[i, half + i] = 1.0  # out[half + i] = x1[i]
    return R


def rotary_frequencies(d: int, rotary_dim: int, theta: float, proportional: bool = False) -> torch.Tensor:
    """inv_freq_full [d]: theta^(-2i/rotary_dim) for each half of the rotary dims, 0 beyond.
    `proportional` (transformers' "proportional" RoPE, LFM3's full-attention layers): the pairs
    span the whole head, (i, i + d/2) for i < rotary_dim/2, at theta^(-2i/d); frequency 0 on
    the rest of each half (rotate with `rotate_half_matrix(d, d)`)."""
    if proportional:
        inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / d))
        half = torch.cat([inv, torch.zeros(d // 2 - rotary_dim // 2)])
        return torch.cat([half, half])
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    return torch.cat([inv, inv, torch.zeros(d - rotary_dim)])


def apply_rotary_naive(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float,
                       proportional: bool = False) -> torch.Tensor:  # fmt: skip
    """Rotate-half RoPE on the first rotary_dim dims of x [T, heads, d], the rest unchanged;
    `proportional`: on the pairs (i, i + d/2), i < rotary_dim/2, at theta^(-2i/d) (see
    `rotary_frequencies`)."""
    if proportional:
        d = x.shape[-1]
        inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / d))
        freqs = positions.float().view(-1, 1) * torch.cat([inv, torch.zeros(d // 2 - rotary_dim // 2)]).view(1, -1)
        emb = torch.cat([freqs, freqs], -1)[:, None]
        return x * emb.cos() + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * emb.sin()
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    freqs = positions.float().view(-1, 1) * inv.view(1, -1)
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    x1, x2 = rot[..., : rotary_dim // 2], rot[..., rotary_dim // 2 :]
    return torch.cat([rot * cos + torch.cat([-x2, x1], -1) * sin, rest], -1)
