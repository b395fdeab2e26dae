"""This runtime's fp16 sums, emulated in torch (ssmport.gate.accumulation), and the 16-bit gates'
noise floor they give (ssmport.gate.report)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ssmport.gate.accumulation import fp16_running_sums, stored_weight
from ssmport.gate.report import run_gate
from ssmport.ops.matmul import BlockwiseMatmul, FloatMatmul
from ssmport.quant.blockwise import quantize_blockwise
from ssmport.quant.int8 import quantize_int8_blockwise
from ssmport.quant.recipes import RUNTIME_FLOOR_FACTOR, GateThresholds, get_recipe
from test_parity_logic import Scripted

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def _weights(n_in: int, n_out: int) -> torch.Tensor:
    return torch.randn(n_in, n_out, generator=torch.Generator().manual_seed(n_in + n_out)) / n_in**0.5


def _blocks(b) -> BlockwiseMatmul:
    return BlockwiseMatmul(b.q, b.scale, b.zero_point, b.bits)


# Every form a 16-bit matmul ships in: one row and many; plain, column-blocked and transposed
# (ssmport.ops.matmul); fp16 weights, int8 blocks, int4 blocks with zero points.
FORMS = {
    "fp16, one row": (lambda: FloatMatmul(_weights(256, 512).half()), 1),
    "fp16, column blocks, 3 rows": (lambda: FloatMatmul(_weights(128, 4096).half()), 3),
    "fp16, transposed wide product, 2 rows": (lambda: FloatMatmul(_weights(64, 4099).half()), 2),
    "int8 blocks, one row": (lambda: BlockwiseMatmul(*quantize_int8_blockwise(_weights(768, 384))), 1),
    "int4 blocks with zero points, 2 rows": (lambda: _blocks(quantize_blockwise(_weights(256, 256), 4, affine=True)), 2),
}


@pytest.mark.parametrize("form", FORMS)
def test_fp16_running_sums_are_this_runtimes_sums_bit_for_bit(form):
    from coreai.runtime import NDArray
    from coreai_micro import loaded_main

    make, rows = FORMS[form]
    layer = make()
    x = np.random.default_rng(rows).standard_normal((rows, stored_weight(layer).shape[0])).astype(np.float32)
    with loaded_main(layer, x, []) as (loop, fn):
        out = loop.run_until_complete(fn(inputs={"x": NDArray(x)}, state={}))
    got = torch.from_numpy(out["y"].numpy().astype(np.float32)).reshape(rows, -1)
    w = stored_weight(layer)
    assert torch.equal(got, fp16_running_sums(torch.from_numpy(x), w).float())
    # the same products summed in fp32 (what torch or a GPU would do) are not what this runtime returns
    assert not torch.equal(got, (torch.from_numpy(x).half().float() @ w.float()).half().float())


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
