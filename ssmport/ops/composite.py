"""coreai-torch's composite ops in place of ssmport's plain forms, chosen per op: the one place
that decides (docs/composite-ops.md has the measurements behind the defaults).

coreai-torch ships RMSNorm, RoPE and SDPA (and GatedDeltaUpdate, GatherMM: measured and not
used, docs/gated_deltanet.md, docs/hybrids.md) as composite ops whose reference decomposition a
device backend may replace by a fused kernel; this Linux runtime inlines them (its pass
MarkCompositeOpsForInlining), so here a composite costs what its reference decomposition
costs. `ops.norms.rms_norm` and `ops.attention.{decode, chunk, rotate}` ask `enabled(op)` and
call the forms below when it is on. SDPA reaches the asset as a composite (torch's ATen op,
which the converter keeps); RMSNorm and RoPE are coreai-torch's modules traced inline: the ops
this runtime runs for them, but no composite a device could see (that needs externalization,
docs/composite-ops.md).

Default: every op plain, in both layouts. Choose others for one export with `chosen(...)`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F

OPS = ("rms_norm", "rope", "sdpa")
DEFAULT: frozenset[str] = frozenset()  # measured: docs/composite-ops.md

_chosen: frozenset[str] = DEFAULT


def enabled(op: str) -> bool:
    return op in _chosen


@contextlib.contextmanager
def chosen(ops: Iterable[str]) -> Iterator[None]:
    """Within this block, modules built and traced use the composite form of `ops` (names
    from OPS) and the plain form of the rest."""
    global _chosen
    ops = frozenset(ops)
    unknown = sorted(ops - set(OPS))
    if unknown:
        raise ValueError(f"unknown composite op(s) {', '.join(unknown)}; known: {', '.join(OPS)}")
    before, _chosen = _chosen, ops
    try:
        yield
    finally:
        _chosen = before


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """coreai-torch's RMSNormImpl: x * rsqrt(mean(x*x) + eps) * weight, over the last dim."""
    from coreai_torch.composite_ops import RMSNormImpl

    return RMSNormImpl(eps=eps)(x, weight)


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, pairs: int) -> torch.Tensor:
    """coreai-torch's RoPE (rotate-half, non-interleaved) on x [T, heads, d]: dims i and i+pairs
    (i < pairs) rotated by positions * inv_freq[i], the rest passed through. `inv_freq` is
    ops.attention's full [d] vector; its first `pairs` entries are the pairs' frequencies (0 on
    pairs that do not turn: LFM3's proportional RoPE)."""
    from coreai_torch.composite_ops import RoPE

    angles = positions.float().view(-1, 1) * inv_freq[:pairs].view(1, -1)  # [T, pairs]
    T = x.shape[0]
    return RoPE(dims=2 * pairs)(x, cos=torch.cos(angles).view(T, 1, pairs), sin=torch.sin(angles).view(T, 1, pairs))


def sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """torch's scaled_dot_product_attention, which coreai-torch keeps as the composite
    `scaled_dot_product_attention` (its decomposition table preserves the ATen op; no
    externalization needed): q [T, H, d] over keys, values [KVH, S, d] (GQA: query head h reads kv
    head h // (H / KVH)), mask bool [T, S] (True: attended). Returns o [T, H, d]."""
    T, H, d = q.shape
    KVH, S = keys.shape[0], keys.shape[1]
    o = F.scaled_dot_product_attention(q.permute(1, 0, 2).reshape(1, H, T, d), keys.view(1, KVH, S, d),
                                       values.view(1, KVH, S, d), attn_mask=mask.view(1, 1, T, S), scale=scale,
                                       enable_gqa=True)  # fmt: skip
    return o.view(H, T, d).permute(1, 0, 2)
