"""This runtime's fp16 sums, emulated in torch (ssmport.gate.accumulation), and the 16-bit gates'
noise floor they give (ssmport.gate.report)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from ssmport.gate.accumulation import fp16_running_sums, runtime_fp16_sums
from ssmport.gate.report import run_gate
from ssmport.ops.matmul import BlockwiseMatmul, FloatMatmul, Int4Experts, Int8Experts, pack_nibbles
from ssmport.quant.blockwise import quantize_blockwise
from ssmport.quant.int8 import quantize_int8_blockwise
from ssmport.quant.recipes import RUNTIME_FLOOR_FACTOR, GateThresholds, get_recipe
from test_parity_logic import Scripted

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def _weights(n_in: int, n_out: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n_in, n_out, generator=torch.Generator().manual_seed(n_in + n_out + seed)) / n_in**0.5


def _blocks(b) -> BlockwiseMatmul:
    return BlockwiseMatmul(b.q, b.scale, b.zero_point, b.bits)


class _ChosenExperts(nn.Module):
    """Each row times the expert `idx` picks for it, as a mixture-of-experts decode step gathers them."""

    def __init__(self, stack, idx: list[int]):
        super().__init__()
        self.stack = stack
        self.register_buffer("idx", torch.tensor(idx))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stack.times(x.to(self.stack.dtype).view(x.shape[0], 1, 1, -1), self.idx).float().reshape(x.shape[0], -1)


def _expert_stack(bits: int, experts: int = 4, n_in: int = 128, n_out: int = 96):
    stack = [quantize_blockwise(_weights(n_in, n_out, e), 8) for e in range(experts)]
    q, scale = torch.stack([b.q for b in stack]), torch.stack([b.scale for b in stack])
    if bits == 8:
        return Int8Experts(q, scale)
    four = [quantize_blockwise(_weights(n_in, n_out, e), 4) for e in range(experts)]
    return Int4Experts(torch.stack([pack_nibbles(b.q) for b in four]), torch.stack([b.scale for b in four]))


# Every form a 16-bit matmul ships in: one row and many; plain, column-blocked and transposed
# (ssmport.ops.matmul); fp16 weights, int8 blocks, int4 blocks with zero points; gathered
# int8 and int4 expert stacks (ssmport.models.moe). Each is run by torch inside
# runtime_fp16_sums() and compared with the runtime, bit for bit.
FORMS = {
    "fp16, one row": (lambda: FloatMatmul(_weights(256, 512).half()), 256, 1),
    "fp16, column blocks, 3 rows": (lambda: FloatMatmul(_weights(128, 4096).half()), 128, 3),
    "fp16, transposed wide product, 2 rows": (lambda: FloatMatmul(_weights(64, 4099).half()), 64, 2),
    "int8 blocks, one row": (lambda: BlockwiseMatmul(*quantize_int8_blockwise(_weights(768, 384))), 768, 1),
    "int4 blocks with zero points, 2 rows": (lambda: _blocks(quantize_blockwise(_weights(256, 256), 4, affine=True)), 256, 2),
    "int8 expert stack, 2 tokens": (lambda: _ChosenExperts(_expert_stack(8), [3, 1]), 128, 2),
    "int4 expert stack, 2 tokens": (lambda: _ChosenExperts(_expert_stack(4), [0, 2]), 128, 2),
}


@pytest.mark.parametrize("form", FORMS)
def test_fp16_matmuls_in_torch_sum_as_this_runtime_bit_for_bit(form):
    from coreai.runtime import NDArray
    from coreai_micro import loaded_main

    make, n_in, rows = FORMS[form]
    layer = make().eval()
    x = np.random.default_rng(rows).standard_normal((rows, n_in)).astype(np.float32)
    with loaded_main(layer, x, []) as (loop, fn):
        out = loop.run_until_complete(fn(inputs={"x": NDArray(x)}, state={}))
    got = torch.from_numpy(out["y"].numpy().astype(np.float32)).reshape(rows, -1)
    with torch.no_grad():
        with runtime_fp16_sums():
            assert torch.equal(got, layer(torch.from_numpy(x)).float().reshape(rows, -1))
        # the same products summed in fp32 (what torch does outside, or a GPU) are not what this runtime returns
        assert not torch.equal(got, layer(torch.from_numpy(x)).float().reshape(rows, -1))


def test_running_sums_take_torch_matmul_shapes():
    g = torch.Generator().manual_seed(0)
    for xs, ws in [((5,), (5, 3)), ((2, 5), (5,)), ((4, 1, 2, 5), (3, 5, 6)), ((5,), (5,))]:
        x, w = torch.randn(xs, generator=g).half(), torch.randn(ws, generator=g).half()
        got, want = fp16_running_sums(x, w), (x.float() @ w.float())
        assert got.shape == want.shape and got.dtype == torch.float16
        assert torch.allclose(got.float(), want, atol=1e-2, rtol=1e-2)


T16 = GateThresholds(max_rel_logit_delta=0.05, tie_rel_margin=0.02, runtime_floor_factor=2.0)  # at scale 5: 0.25


def gate16(ref_rows, got_rows, floor_abs, twin_rows=None):
    twin = None if twin_rows is None else Scripted(twin_rows)
    return run_gate(Scripted(got_rows), Scripted(ref_rows), [[1] * len(ref_rows)], "test", T16,
                    twin=twin, runtime_floor_abs=floor_abs)  # fmt: skip


def test_the_fp16_floor_lifts_the_limit_and_never_excuses_more():
    ref = [[0, 5.0, 1.0]]
    assert not gate16(ref, [[0, 5.4, 1.0]], None).passed  # 0.08 of scale: over 0.05, no floor
    lifted = gate16(ref, [[0, 5.4, 1.0]], 0.3, twin_rows=[[0, 5.4, 1.0]])  # limit 2 x 0.3 / 5 = 0.12
    assert lifted.passed and lifted.limit == pytest.approx(0.12)
    f = lifted.runtime_floor()
    assert f["reference_in_fp16_vs_reference_rel"] == pytest.approx(0.06) and f["bundle_vs_twin_abs"] == 0
    assert "floor in fp16 with this runtime's sums" in lifted.headline()
    assert not gate16(ref, [[0, 5.7, 1.0]], 0.3).passed  # 0.14 of scale: over 2 x the floor
    assert gate16(ref, [[0, 5.2, 1.0]], 0.01).limit == 0.05  # a floor below the recipe's limit changes nothing


def test_the_fp16_floor_widens_the_tie_margin():
    # a flip at margin 0.4 (0.08 of scale): excused with a floor of 0.3 (2 x 0.3 = 0.6), not with none
    ref, got = [[0, 5.0, 4.6]], [[0, 4.8, 4.9]]
    assert [s.status for s in gate16(ref, got, 0.3).steps] == ["tie"]
    assert [s.status for s in gate16(ref, got, None).steps] == ["mismatch"]


def test_a_recipe_over_its_limit_fails_whatever_the_floor():
    r = gate16([[0, 5.0, 1.0]], [[0, 5.4, 1.0]], 0.3)
    assert r.passed
    r.set_recipe_split([np.array([[0, 5.0, 1.0]])], [np.array([[0, 5.3, 1.0]])])  # the recipe alone 0.06 > 0.05
    assert not r.passed and not r.recipe_within_limit and "OVER its limit" in r.headline()


def test_every_16bit_recipe_has_the_floor_and_fp32_does_not():
    for name in ("fp16", "int8keepproj", "int4keepproj", "int8", "int4", "auto"):
        assert get_recipe(name).gate.runtime_floor_factor == RUNTIME_FLOOR_FACTOR
    assert get_recipe("fp32").gate.runtime_floor_factor is None
