"""The speed layouts of the export form: column-blocked wide matmuls, the deferred WKV update."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rwkv7_files import Dims, blinkdl_state_dict, rwkv_package_logits, write_pth
from ssmport.ops.matmul import FloatMatmul, out_blocks, reference_sums
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.recipes import get_recipe
from ssmport.runtime import Runner


@pytest.mark.parametrize(
    "n_out, blocks",
    [(320, 1), (2048, 1), (3072, 3), (4096, 4), (65536, 64), (5000, 5), (3352, 4), (50288, 56), (4099, 1),
     (17504, 16), (10576, 8), (32784, 24), (9228, 12), (6680, 8), (3075, 5), (4097, 1)],  # fmt: skip
)
def test_out_blocks(n_out, blocks):
    assert out_blocks(n_out) == blocks


@pytest.mark.parametrize("shape", [(1, 96), (5, 96), (2, 3, 96)])
def test_blocked_matmul_is_x_at_w(shape):
    w = torch.randn(96, 4096, generator=torch.Generator().manual_seed(0))
    m = FloatMatmul(w)
    assert m.blocks == 4 and m.weight.shape == (4, 96, 1024)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(m(x), x @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_out", [2048, 4096])  # one block; four column blocks
@pytest.mark.parametrize("rows", [1, 3])
def test_reference_sums_are_as_accurate_as_the_reference_loops(n_out, rows):
    """Under `reference_sums` a float matmul sums as accurately as the reference loops' W @ x
    (torch's CPU x @ W [in, out] adds the 2048 products in a row: 4x the error at this width).
    Outside it (every runner, every export) the product is the plain x @ W."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(2048, n_out, generator=g) / 2048**0.5
    x = torch.randn(rows, 2048, generator=g)
    m = FloatMatmul(w)
    exact = x.double() @ w.double()
    error = lambda y: (y.double() - exact).abs().max().item()  # noqa: E731
    loop = torch.stack([torch.mv(w.t().contiguous(), row) for row in x])  # W [out, in] @ x, row by row
    with reference_sums():
        summed = m(x)
    assert error(summed) <= 2 * error(loop)
    if n_out == 2048:
        assert torch.equal(m(x), x @ w)


def test_plan_records_the_logical_shape():
    b = WeightBuilder(get_recipe("fp32"), lambda name: True)
    b.matmul("head.weight", torch.zeros(64, 4096), "head")
    assert b.plan_json()[0]["shape"] == [64, 4096] and b.plan_json()[0]["bytes"] == 64 * 4096 * 4


def test_wide_model_on_core_ai_matches_blinkdl_package(tmp_path, export_fn):
    """Head (vocab 4096) and FFN key (3072 wide) both column-blocked, on the runtime, against
    BlinkDL's `rwkv` package; 3 layers so the deferred update covers more than one slice."""
    d = Dims(vocab=4096, ffn=3072, layers=3)
    pth = write_pth(tmp_path / "wide.pth", blinkdl_state_dict(d, seed=21))
    result = export_fn(pth, tmp_path / "out", quant="fp32", gate=False)
    blocked = {e["name"] for e in result.manifest.plan_tensors if out_blocks(e["shape"][-1]) > 1}
    assert {"head.weight", "blocks.0.ffn.key.weight"} <= blocked
    tokens = [1, 4095, 7, 7, 300, 2048, 0, 11]
    with Runner(result.path) as runner:
        ours = runner.step_each(tokens)
    theirs = rwkv_package_logits(pth, tokens).numpy()
    assert np.abs(theirs - ours).max() / max(1.0, np.abs(theirs).max()) < 1e-4
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()
