"""coreai-torch's composite forms (ssmport.ops.composite) against ssmport's plain ones: each op in
torch, and whole tiny bundles exported with every composite chosen, run on the Core AI runtime,
against the plain fp32 module in torch, within the fp32 gate's bound (quant/recipes.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ssmport.gate.torch_runner import TorchRunner
from ssmport.loader.resolve import load_model
from ssmport.ops import attention, composite, sliding
from ssmport.ops.norms import rms_norm, rms_norm_naive
from ssmport.quant.recipes import FP16_LOGITS_GATE, get_recipe
from ssmport.runtime import Runner

TOKENS = [3, 17, 5, 60, 9, 11, 2, 44, 80, 7, 30, 12, 12, 12, 91, 0, 4, 4, 19, 23]


@pytest.fixture
def calls(monkeypatch):
    """How often each composite form ran (so a switch that is ignored cannot pass)."""
    counted = {op: 0 for op in composite.OPS}

    def counting(op):
        form = getattr(composite, op)

        def wrapper(*args, **kwargs):
            counted[op] += 1
            return form(*args, **kwargs)

        return wrapper

    for op in composite.OPS:
        monkeypatch.setattr(composite, op, counting(op))
    return counted


def test_the_default_is_plain_and_unknown_names_are_refused():
    assert not any(composite.enabled(op) for op in composite.OPS)
    with pytest.raises(ValueError, match="unknown composite op"):
        with composite.chosen(["rmsnorm"]):
            pass
    with composite.chosen(["rope"]):
        assert composite.enabled("rope") and not composite.enabled("sdpa")
    assert not composite.enabled("rope")


def test_rms_norm_composite_equals_the_plain_form(calls):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 5, 24, generator=g), torch.randn(24, generator=g)
    with composite.chosen(["rms_norm"]):
        ours = rms_norm(x, w, 1e-6)
    assert calls["rms_norm"] == 1
    assert torch.equal(ours, rms_norm(x, w, 1e-6))  # the same ops in the same order
    torch.testing.assert_close(ours, rms_norm_naive(x, w, 1e-6))


@pytest.mark.parametrize("d, rotary, proportional", [(16, 16, False), (16, 8, False), (16, 4, True)])
def test_rope_composite_equals_the_naive_rotation(d, rotary, proportional, calls):
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(5, 4, d, generator=g), torch.randn(5, 2, d, generator=g)
    positions = torch.tensor([0, 1, 7, 100, 4000])
    inv = attention.rotary_frequencies(d, rotary, 10000.0, proportional)
    pairs = (d if proportional else rotary) // 2
    R = attention.rotate_half_matrix(d, 2 * pairs)
    with composite.chosen(["rope"]):
        cq, ck = attention.rotate(q, k, positions, inv, R, pairs)
    pq, pk = attention.rotate(q, k, positions, inv, R, pairs)
    assert calls["rope"] == 2
    torch.testing.assert_close(cq, pq)
    torch.testing.assert_close(ck, pk)
    torch.testing.assert_close(cq, attention.apply_rotary_naive(q, positions, rotary, 10000.0, proportional))


@pytest.mark.parametrize("ops", [attention, sliding])
def test_sdpa_composite_equals_the_plain_attention(ops, calls):
    g = torch.Generator().manual_seed(2)
    H, KVH, C, d, T = 6, 2, 12, 8, 5
    K, V = torch.randn(KVH, C, d, generator=g), torch.randn(KVH, C, d, generator=g)
    q, k, v = torch.randn(T, H, d, generator=g), torch.randn(T, KVH, d, generator=g), torch.randn(T, KVH, d, generator=g)
    for start in (0, 3, 9):
        position = torch.tensor([start])
        plain = (ops.decode(q[0], k[0], v[0], K, V, position, 0.3), ops.chunk(q, k, v, K, V, position, 0.3))
        with composite.chosen(["sdpa"]):
            ours = (ops.decode(q[0], k[0], v[0], K, V, position, 0.3), ops.chunk(q, k, v, K, V, position, 0.3))
        assert calls["sdpa"] == 2 * (1 + (start > 0) + (start > 3))
        for a, b in zip(ours, plain):
            torch.testing.assert_close(a, b)


def plain_logits(preset: str) -> np.ndarray:
    """The plain fp32 export-form module in torch, one token at a time: [T, V]."""
    runner = TorchRunner(load_model(preset, synthetic=True), "fp32")
    try:
        return np.stack([runner.step(t) for t in TOKENS])
    finally:
        runner.close()


# qwen3.5: RMSNorm (gains 1+w), partial RoPE, SDPA with the output gate; lfm3: proportional RoPE and
# sliding-window SDPA over the ring; lfm2: full RoPE, q/k norms per head.
@pytest.mark.parametrize("preset, layout", [("qwen3.5-tiny", "ssmport"), ("lfm3-tiny", "ssmport"),
                                            ("lfm2-tiny", "apple")])  # fmt: skip
def test_a_bundle_with_every_composite_matches_the_plain_module(preset, layout, tmp_path, calls):
    import ssmport

    with composite.chosen(composite.OPS):
        result = ssmport.export(preset, tmp_path, synthetic=True, quant="fp32", layout=layout, gate=False,
                                progress=False)  # fmt: skip
    assert all(calls.values()), calls
    want = plain_logits(preset)
    bound = (FP16_LOGITS_GATE if layout == "apple" else get_recipe("fp32").gate).max_rel_logit_delta
    bound *= max(1.0, float(np.abs(want).max()))
    with Runner(result.path) as runner:
        decoded = np.stack([runner.step(t) for t in TOKENS])
        runner.reset()
        prompt = runner.feed(TOKENS)
    assert np.abs(decoded - want).max() <= bound, np.abs(decoded - want).max()
    assert np.abs(np.asarray(prompt).reshape(-1) - want[-1]).max() <= bound
    assert (decoded.argmax(-1) == want.argmax(-1)).all()
