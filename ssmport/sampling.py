"""Next-token choice: greedy, or temperature with nucleus (top-p) filtering."""

from __future__ import annotations

import numpy as np

from ssmport.errors import SsmportError


def sample_next(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    if temperature < 0 or not 0 < top_p <= 1:
        raise SsmportError("need temperature >= 0 and 0 < top-p <= 1")
    if temperature == 0:
        return int(np.argmax(logits))
    probs = sampling_probs(logits, temperature, top_p)
    return int(rng.choice(len(probs), p=probs))


def sampling_probs(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """The distribution `sample_next` draws from at temperature > 0 (float64, sums to 1):
    speculative decoding (ssmport.runtime.speculative) must keep exactly this one."""
    z = logits.astype(np.float64) / temperature
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if top_p < 1:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        keep = order[: int(np.searchsorted(cumulative, top_p)) + 1]
        mask = np.zeros_like(probs)
        mask[keep] = probs[keep]
        probs = mask / mask.sum()
    return probs
