"""Recipes: what is stored how, that the asset really holds it, and that each recipe gates."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
import torch

from rwkv7_files import Dims, blinkdl_state_dict, write_pth
from ssmport.cli.main import main
from ssmport.graph import Embedding
from ssmport.quant import BLOCK_SIZE, get_recipe
from ssmport.quant.blockwise import dequantize_blockwise, quantize_blockwise
from ssmport.quant.int8 import dequantize_int8_blockwise, quantize_int8_blockwise
from ssmport.quant.plan import WeightBuilder
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_checkpoint

BULK = re.compile(r"blocks\.\d+\.ffn\.(key|value)\.weight|head\.weight")


def plan_for(model, recipe: str) -> list[dict]:
    builder = WeightBuilder.for_architecture(get_recipe(recipe), model.architecture)
    model.architecture.build_decode(model.config, model.weights, builder, torch.float32)
    return builder.plan_json()


def test_int8_blockwise_against_numpy():
    w = torch.randn(96, 40, generator=torch.Generator().manual_seed(0))
    w[32:64, 3] = 0.0  # an all-zero block
    q, scale = quantize_int8_blockwise(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float16 and scale.shape == (3, 40)
    blocks = w.numpy().reshape(3, 32, 40)
    expect_scale = (np.abs(blocks).max(axis=1) / 127).astype(np.float16)
    np.testing.assert_array_equal(scale.numpy()[expect_scale > 0], expect_scale[expect_scale > 0])
    err = np.abs(dequantize_int8_blockwise(q, scale).numpy() - w.numpy()).reshape(3, 32, 40)
    assert (err <= scale.float().numpy()[:, None, :] / 2 + 1e-6).all()
    assert q.abs().max() == 127
    assert (dequantize_int8_blockwise(q, scale)[32:64, 3] == 0).all()


@pytest.mark.parametrize("affine", [False, True])
def test_int4_blockwise_against_numpy(affine):
    w = torch.randn(96, 40, generator=torch.Generator().manual_seed(1))
    w[32:64, 3] = 0.0  # an all-zero block
    w[64:, 5] = w[64:, 5].abs() + 1.0  # a block of one sign: affine spends every level on it
    b = quantize_blockwise(w, bits=4, affine=affine)
    blocks = w.numpy().reshape(3, 32, 40)
    if affine:
        lo, hi = np.minimum(blocks.min(axis=1), 0), np.maximum(blocks.max(axis=1), 0)
        expect_scale = ((hi - lo) / 15).astype(np.float16)
        assert b.q.dtype == torch.uint8 and 0 <= int(b.q.min()) and int(b.q.max()) == 15
        assert b.zero_point.dtype == torch.uint8 and int(b.zero_point.max()) <= 15 and b.storage_dtype == "uint4"
        bound = b.scale.float().numpy()[:, None, :]  # a block's two ends may round one level apart
    else:
        expect_scale = (np.abs(blocks).max(axis=1) / 7).astype(np.float16)
        assert b.q.dtype == torch.int8 and int(b.q.abs().max()) == 7 and b.zero_point is None
        assert b.storage_dtype == "int4"
        bound = b.scale.float().numpy()[:, None, :] / 2 + 1e-6
    nonzero = expect_scale > 0
    np.testing.assert_array_equal(b.scale.numpy()[nonzero], expect_scale[nonzero])
    err = np.abs(dequantize_blockwise(b).numpy() - w.numpy()).reshape(3, 32, 40)
    assert (err <= bound + 1e-6).all()
    assert (dequantize_blockwise(b)[32:64, 3] == 0).all()
    # 4-bit data packs two to a byte; scales are fp16 and zero points 4-bit, one per block
    assert b.nbytes == 96 * 40 // 2 + 3 * 40 * 2 + (3 * 40 // 2 if affine else 0)


@pytest.mark.parametrize("form, bound", [("int8", 127), ("int4", 7)])
def test_quantized_table_reads_the_rows_numpy_dequantizes(form, bound):
    """An embedding table an `auto` plan stores as integers: symmetric blocks of 32 along the
    width, one fp16 scale each; a lookup dequantizes only the rows it reads."""
    table = torch.randn(50, 96, generator=torch.Generator().manual_seed(2))
    table[7, 32:64] = 0.0  # an all-zero block
    b = WeightBuilder(dataclasses.replace(get_recipe("auto"), per_tensor=(("emb", form),)), lambda name: False)
    embed = Embedding(b.table("emb", table, "embedding"))
    ids = torch.tensor([[3, 49, 0, 3, 7]])
    blocks = table.numpy().reshape(50, 3, 32)
    scale = (np.abs(blocks).max(axis=2, keepdims=True) / bound).astype(np.float16).astype(np.float32)
    q = np.clip(np.round(np.divide(blocks, scale, out=np.zeros_like(blocks), where=scale > 0)), -bound, bound)
    expect = (q * scale).reshape(50, 96)[ids[0].numpy()]
    np.testing.assert_allclose(embed(ids)[0].numpy(), expect, rtol=0, atol=1e-6)
    (entry,) = b.entries
    assert (entry.dtype, entry.block, entry.shape) == (form, BLOCK_SIZE, (50, 96))
    assert entry.bytes == 50 * 96 * (8 if form == "int8" else 4) // 8 + 50 * 3 * 2


def test_int4keepproj_plan(blinkdl_pth):
    """FFN int4; head and (RWKV-7's measured int8-safe) r/k/v/o and LoRAs int8; the rest as int8keepproj."""
    model = load_checkpoint(blinkdl_pth)
    plan = {e["name"]: e for e in plan_for(model, "int4keepproj")}
    kept = {e["name"]: e for e in plan_for(model, "int8keepproj")}
    assert plan.keys() == kept.keys()
    for name, e in plan.items():
        if e["role"] == "ffn":
            assert (e["dtype"], e["block"]) == ("int4", BLOCK_SIZE), e
        elif e["role"] in ("head", "state_proj", "lora") and kept[name]["shape"][0] % BLOCK_SIZE == 0:
            assert (e["dtype"], e["block"]) == ("int8", BLOCK_SIZE), e
        else:
            assert e == kept[name]
    assert {e["dtype"] for e in plan_for(model, "int4") if e["role"] in ("ffn", "head", "state_proj")} == {"int4"}


def test_predicate_keeps_exactly_the_documented_tensors(blinkdl_pth):
    model = load_checkpoint(blinkdl_pth)
    plan = plan_for(model, "int8keepproj")
    for e in plan:
        if BULK.fullmatch(e["name"]):
            assert (e["dtype"], e["block"], e["role"]) == ("int8", BLOCK_SIZE, "head" if "head" in e["name"] else "ffn")
        elif e["role"] in ("norm", "mix"):  # per-channel vectors of fp32 elementwise math
            assert e["dtype"] == "float32" and len(e["shape"]) <= 2, e
        else:
            assert e["dtype"] == "float16", e
    kept = {e["role"] for e in plan if e["dtype"] != "int8"}
    assert kept == {"embedding", "state_proj", "lora", "norm", "mix"}
    names = {e["name"] for e in plan if e["dtype"] != "int8"}
    for expected in ("blocks.0.att.receptance.weight", "blocks.0.att.key.weight", "blocks.0.att.value.weight",
                     "blocks.0.att.output.weight", "blocks.1.att.w1", "blocks.1.att.a2", "blocks.1.att.v1",
                     "blocks.1.att.g2", "blocks.0.att.k_k", "blocks.0.att.k_a", "blocks.0.att.r_k",
                     "blocks.0.att.w0", "blocks.0.att.a0", "blocks.1.att.v0", "blocks.0.ln1.weight",
                     "blocks.0.att.ln_x.bias", "emb.weight", "blocks.0.att.x_{r,w,k,v,a,g}"):  # fmt: skip
        assert expected in names


def test_int8_everywhere_and_float_recipes(blinkdl_pth, tmp_path):
    model = load_checkpoint(blinkdl_pth)
    for e in plan_for(model, "int8"):
        matmul = e["role"] in ("ffn", "head", "state_proj", "lora")
        assert e["dtype"] == ("int8" if matmul else "float32" if e["role"] in ("norm", "mix") else "float16"), e
    assert {e["dtype"] for e in plan_for(model, "fp16") if e["role"] not in ("norm", "mix")} == {"float16"}
    assert {e["dtype"] for e in plan_for(model, "fp32")} == {"float32"}
    # a LoRA rank that is not a multiple of the block stays in float, and the plan says so
    odd = load_checkpoint(write_pth(tmp_path / "odd.pth", blinkdl_state_dict(Dims(d_w=8), seed=1)))
    w1 = next(e for e in plan_for(odd, "int8") if e["name"] == "blocks.0.att.w2")
    assert w1["dtype"] == "float16" and w1["block"] is None


@pytest.fixture(scope="module")
def sized_checkpoint(tmp_path_factory):
    """Big enough that weights dominate the asset (~5 M parameters)."""
    d = Dims(vocab=4096, width=256, layers=2, head=64, ffn=1024)
    return write_pth(tmp_path_factory.mktemp("sized") / "sized.pth", blinkdl_state_dict(d, seed=21))


@pytest.mark.parametrize("recipe", ["fp16", "int8keepproj", "int8", "int4keepproj", "int4"])
def test_asset_really_stores_the_plan(sized_checkpoint, tmp_path, export_fn, recipe):
    from coreai.authoring import AIModelAsset

    result = export_fn(sized_checkpoint, tmp_path, quant=recipe, gate=False)
    m = result.manifest
    plan = m.plan_tensors
    summary = AIModelAsset.load(result.path / "model.aimodel").summary(include_statistics=True)
    stored = dict(summary.storage_types)  # element counts by storage dtype

    def elements(dtype: str) -> int:
        return sum(int(np.prod(e["shape"])) for e in plan if e["dtype"] == dtype)

    integer = [e for e in plan if e["block"]]
    scale_elements = sum(int(np.prod(e["shape"])) // BLOCK_SIZE for e in integer)
    # The converter adds one splat zero-point (int8) and one splat offset (fp16) per distinct
    # scale shape: splats cost no bytes (see the on-disk check) but count as elements here.
    # Affine 4-bit blocks store their zero points as uint4, one per scale.
    for dtype, asset_name in (("int8", "Int8"), ("int4", "Int4"), ("uint4", "UInt4")):
        zero_points = sum(int(np.prod(e["shape"])) // BLOCK_SIZE for e in integer if e["dtype"] == dtype == "uint4")
        assert elements(dtype) + zero_points <= int(stored.get(asset_name, 0)) <= elements(dtype) + zero_points + (
            scale_elements if elements(dtype) else 0), dtype
    assert {e["dtype"] for e in integer} <= {"int8", "int4", "uint4"}
    fp16_extra = int(stored["Float16"]) - elements("float16") - scale_elements
    assert 0 <= fp16_extra <= scale_elements + 64
    # float32 beyond the plan: the prefill chunk's masks ([T, T] and [H, T, T] constants the WY
    # form builds), bounded by the chunk, never by the weights
    T, heads = m.prefill.chunk, m.config["hidden_size"] // m.config["head_size"]
    assert 0 <= int(stored["Float32"]) - elements("float32") < 8 * T * T * (1 + heads)
    # the asset is the plan (4-bit data two to a byte), its container overhead and those masks
    masks = 8 * T * T * (1 + heads) * 4
    assert 0 <= m.asset.bytes - m.plan["summary"]["total"] < 0.02 * m.plan["summary"]["total"] + masks
    # one dequantize op per integer tensor in each function (main, prefill); the data is stored
    # once (the element counts above)
    ops = dict(summary.operation_distribution)
    functions = 1 + (m.prefill is not None)
    assert functions == 2
    assert int(ops.get("blockwise_shift_scale", 0)) == functions * len(integer)


def test_int8keepproj_shrinks_the_asset(sized_checkpoint, tmp_path, export_fn):
    sizes = {r: export_fn(sized_checkpoint, tmp_path, quant=r, gate=False).manifest.asset.bytes
             for r in ("fp32", "fp16", "int8keepproj")}  # fmt: skip
    assert sizes["fp16"] / sizes["fp32"] < 0.52
    assert sizes["int8keepproj"] / sizes["fp16"] < 0.75


@pytest.mark.parametrize("recipe", ["int8keepproj", "int8"])
def test_int8_recipes_pass_their_gates(blinkdl_pth, bundles, export_fn, recipe):
    result = export_fn(blinkdl_pth, bundles, quant=recipe, gate_steps=12)
    assert result.manifest.gate.passed, result.manifest.gate
    assert result.manifest.main.outputs[0].dtype == "float16"


def test_fp16_state_dtype_bundle(blinkdl_pth, tmp_path, export_fn):
    result = export_fn(blinkdl_pth, tmp_path, quant="fp32", state_dtype="fp16", gate_steps=8)
    assert [s.dtype for s in result.manifest.states] == ["float16", "float16"]
    assert result.manifest.gate.passed
    with Runner(result.path) as runner:  # allocates what the graph declares
        runner.step(3)
        assert runner.state("recState").dtype == np.float16


def test_gate_compare_table(pth_fp32_bundle, capsys):
    code = main(["gate", str(pth_fp32_bundle.path), "--compare", "--prompts", "1", "--steps", "6"])
    out = capsys.readouterr().out
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert set(rows) == {"fp32", "fp16", "int8keepproj", "int8"}
    assert all(line.endswith("PASS") for line in rows.values())


def test_a_4bit_recipe_that_stores_no_4bit_weight_says_so(tmp_path, capsys):
    """Mamba-2 keeps its projections 16-bit and its head int8 under int4keepproj (no 4-bit
    weight at all): the export notes it, names the recipe that does, and records the note; a
    plan holding 4-bit weights, or an 8-bit recipe's, gets no such note."""
    from ssmport.quant.plan import plan_notes

    out = tmp_path / "out"
    assert main(["export", "mamba2-tiny", "--synthetic", "--quant", "int4keepproj", "--no-gate", "-o", str(out), "-q"]) == 0
    err = capsys.readouterr().err
    assert "ssmport: note: int4keepproj stores no 4-bit weight for this architecture" in err
    assert "--quant int4 puts every matmul at 4 bits" in err
    from ssmport.bundle import Bundle

    m = Bundle.open(next(out.iterdir())).manifest
    assert not {"int4", "uint4"} & set(m.plan["summary"]["by_dtype"])
    assert any(n.startswith("int4keepproj stores no 4-bit weight") for n in m.notes)
    four_bit = {"by_dtype": {"float16": 10, "int4": 5}}
    assert plan_notes(get_recipe("int4keepproj"), four_bit) == []
    assert plan_notes(get_recipe("int8keepproj"), {"by_dtype": {"float16": 10, "int8": 5}}) == []
    assert len(plan_notes(get_recipe("int4"), {"by_dtype": {"float16": 10}})) == 1
