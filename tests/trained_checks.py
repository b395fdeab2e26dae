"""What a quantized bundle of a trained model must keep, on held-out text against an independent
fp32 reference (tests/test_trained_rwkv7.py, tests/test_trained_moe.py)."""

from __future__ import annotations

import numpy as np

from ssmport.quant import RECIPES

CONFIDENT_MARGIN = 0.5  # logits: a top-1 this far ahead of the runner-up must survive quantization


def assert_keeps_confident_top1(got: np.ndarray, ref: np.ndarray, quant: str) -> None:
    """The same top-1 at every step where the reference's top-2 margin exceeds CONFIDENT_MARGIN
    (at least half the steps, or the check means little), and max |Δlogits| within the recipe's
    gate bound: the second catches a uniformly wrong scale, which keeps every top-1."""
    top2 = np.sort(ref, axis=1)[:, -2:]
    confident = top2[:, 1] - top2[:, 0] > CONFIDENT_MARGIN
    assert confident.sum() >= len(ref) // 2, "too few confident steps for the check to mean anything"
    flipped = [t for t in np.flatnonzero(confident) if got[t].argmax() != ref[t].argmax()]
    assert not flipped, f"{quant}: top-1 changed at confident steps {[int(t) for t in flipped]}"
    scale = max(1.0, float(np.abs(ref).max()))
    assert np.abs(got - ref).max() <= RECIPES[quant].gate.max_rel_logit_delta * scale
