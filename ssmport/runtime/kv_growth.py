"""How the runner sizes a KV cache whose position axis is dynamic (ssmport.growing_kv, the apple
layout): as Apple's engines do, START positions first, doubled whenever the tokens need more,
never past the context (which `check_room` refuses to exceed). A call then reads and writes the
positions allocated, at most twice the tokens held (or START), not the whole context."""

from __future__ import annotations

import numpy as np

START = 256  # Apple's engines' first allocation


def positions_for(needed: int, context: int, start: int = START) -> int:
    """The positions to allocate for `needed` tokens: start, doubled until it holds them,
    capped at the context."""
    size = max(1, min(start, context))
    while size < needed and size < context:
        size *= 2
    return min(size, context)


def with_rows(array: np.ndarray, positions: int) -> np.ndarray:
    """A zero [L, 1, heads, positions, d] buffer holding `array`'s first positions (as many as fit)."""
    out = np.zeros((*array.shape[:3], positions, *array.shape[4:]), dtype=array.dtype)
    keep = min(positions, array.shape[3])
    out[:, :, :, :keep] = array[:, :, :, :keep]
    return out


__all__ = ["START", "positions_for", "with_rows"]
