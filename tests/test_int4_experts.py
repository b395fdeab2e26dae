"""4-bit routed experts: `Int4Experts` stores two symmetric 4-bit levels a byte and, gathered by
index, gives the weights the int4 blocks represent (against `dequantize_blockwise`); a bundle
with 4-bit experts stores half a byte per expert weight and computes on the Core AI runtime
what its torch twin computes; int4keepproj keeps the experts at int8 (measured:
benchmarks/int4_experts.py) unless the architecture measured them safe at 4 bits on trained
weights (every MoE family here: tests/data/*_moe_pydoc), and `int4` lowers them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import moe_files as mf
from ssmport.exporter.pipeline import export
from ssmport.ops.matmul import Int4Experts, pack_nibbles
from ssmport.quant.blockwise import dequantize_blockwise, quantize_blockwise
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_model
from ssmport.gate.torch_runner import TorchRunner

TOKENS = [3, 17, 41, 5, 88, 23]


def test_int4_experts_select_what_the_blocks_represent():
    g = torch.Generator().manual_seed(0)
    stack = torch.randn(5, 64, 48, generator=g)
    blocks = [quantize_blockwise(w, bits=4) for w in stack]
    experts = Int4Experts(pack_nibbles(torch.stack([b.q for b in blocks])), torch.stack([b.scale for b in blocks]))
    assert experts.q.dtype == torch.uint8 and experts.q.shape == (5, 64, 24)  # half a byte a weight
    idx = torch.tensor([4, 0, 2, 2])
    # the products level x fp16 scale, rounded to fp16 (the scales' dtype, as the bundle computes them)
    want = torch.stack([dequantize_blockwise(blocks[int(i)]) for i in idx]).half()
    assert torch.equal(experts.select(idx), want)
    assert torch.equal(experts.whole(), torch.stack([dequantize_blockwise(b) for b in blocks]).half())


@pytest.mark.parametrize("recipe, bits", [("int4", 4), ("int8", 8)])
def test_a_quantizing_builder_reads_one_expert_at_a_time(recipe, bits):
    """The builder quantizes each expert as it reads it (never the float stack, GBs a layer at
    released widths) into the levels and scales each expert quantized alone has."""
    from ssmport.quant import get_recipe
    from ssmport.quant.plan import ExpertSlices, WeightBuilder

    g = torch.Generator().manual_seed(1)
    stack = torch.randn(4, 64, 48, generator=g)
    reads = []

    class Unstackable(ExpertSlices):
        def stacked(self, dtype=None):
            raise AssertionError("the float stack was built")

    def read(e):
        reads.append(e)
        return stack[e]

    built = WeightBuilder(get_recipe(recipe), lambda name: False).experts("experts", Unstackable(4, read), "ffn", 2)
    assert reads == [0, 1, 2, 3]
    blocks = [quantize_blockwise(w, bits=bits) for w in stack]
    want = torch.stack([dequantize_blockwise(b) for b in blocks]).half()
    assert torch.equal(built.whole(), want)


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    dims = mf.Lfm2MoeDims(layer_types=("conv", "conv", "full_attention"))  # two MoE layers: a short export
    folder = mf.write_lfm2_moe(tmp_path_factory.mktemp("lfm2_moe") / "lfm2_moe", dims, seed=7)
    return load_model(str(folder))


def test_int4_expert_bundle_stores_half_bytes_and_matches_its_torch_twin(moe_model, tmp_path):
    from coreai.authoring import AIModelAsset

    b = export(moe_model, tmp_path, quant="int4", gate=False, prefill_chunk=None, progress=False)
    stacks = [e for e in b.manifest.plan_tensors if e.get("rows_read")]
    assert stacks and all(e["dtype"] == "int4" for e in stacks)
    for e in stacks:
        E, n_in, n_out = e["shape"]
        assert e["bytes"] == E * n_in * n_out // 2 + 2 * E * n_in // 32 * n_out
    stored = dict(AIModelAsset.load(b.path / "model.aimodel").summary(include_statistics=True).storage_types)
    assert int(stored["UInt8"]) == sum(int(np.prod(e["shape"])) // 2 for e in stacks)
    twin = TorchRunner(moe_model, "int4").step_each(TOKENS)
    with Runner(b.path) as runner:
        got = runner.step_each(TOKENS)
    # the same stored weights; only the runtime's fp16 sums differ
    assert np.abs(got - twin).max() < 0.02 * np.abs(twin).max()
    assert (got.argmax(1) == twin.argmax(1)).all()


def test_int4keepproj_keeps_experts_int8_unless_measured_safe_at_4_bits(moe_model):
    # every MoE family here measured its experts safe at 4 bits on a trained model
    # (tests/test_trained_moe.py); one that has not keeps them at the recipe's int8 floor
    arch = moe_model.architecture
    unmeasured = dataclasses.replace(moe_model, architecture=dataclasses.replace(arch, int4_safe_experts=False))
    for model, experts in ((unmeasured, "int8"), (moe_model, "int4")):
        assert model.architecture.int4_safe_experts == (experts == "int4")
        plan = TorchRunner(model, "int4keepproj").builder.entries
        stacks = [e for e in plan if e.rows_read is not None]
        assert stacks and {e.dtype for e in stacks} == {experts}, model.architecture.name
    assert {e.dtype for e in plan if e.role == "ffn" and e.rows_read is None and e.block} == {"int4"}  # LFM2's dense
