"""Long runs stay finite under every recipe.

fp32 decodes 10,000 tokens here. fp16 and int8 graphs are emulated / dequantized on every call
by this Linux runtime (~50-120 ms per token even at vocab 320), so the test runs them for a
few hundred tokens; benchmarks/long_run_drift.py runs every recipe for 10,000 tokens and
records the drift (results in benchmarks/results/, table in docs/quantization.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from ssmport.runtime import Runner

LENGTHS = {"fp32": 10_000, "fp16": 300, "int8keepproj": 150, "int8": 150}


def _stream(n: int, vocab: int = 320) -> list[int]:
    return np.random.default_rng(7).integers(1, vocab, size=n).tolist()


@pytest.mark.parametrize("recipe", list(LENGTHS))
def test_long_decode_has_no_nan_or_inf(recipe, blinkdl_pth, pth_fp32_bundle, pth_fp16_bundle, export_fn, tmp_path):
    bundle = {"fp32": pth_fp32_bundle, "fp16": pth_fp16_bundle}.get(recipe)
    path = bundle.path if bundle else export_fn(blinkdl_pth, tmp_path, quant=recipe, gate=False).path
    with Runner(path) as runner:
        logits = runner.step_each(_stream(LENGTHS[recipe]))
        assert np.isfinite(logits).all()
        assert all(np.isfinite(runner.state(n)).all() for n in runner.state_names)
        assert len(runner.tokens) == LENGTHS[recipe]
    # not a constant or collapsed output either
    assert logits[-100:].std(axis=-1).min() > 0
