"""A tied embedding stored once (ssmport.quant.tied): the table's rows read from the LM head's
stored weight, the asset a table smaller, the logits unchanged."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import hybrid_files as hf
import ssmport.exporter.convert as convert
from ssmport.exporter.pipeline import export
from ssmport.ops.matmul import FloatMatmul
from ssmport.runtime import Runner


@pytest.mark.parametrize("vocab", [96, 5000, 8192, 50288])  # one block; 5, 8 and 56 column blocks
def test_head_columns_are_the_table_rows(vocab):
    table = torch.randn(vocab, 64, generator=torch.Generator().manual_seed(vocab))
    head = FloatMatmul(table.t().contiguous())
    ids = torch.tensor([0, 5, vocab // 2, vocab - 1, 5])
    assert torch.equal(head.columns(ids), table[ids])
    assert head.holds_transpose_of(table)


def test_a_head_that_differs_anywhere_is_not_the_table():
    table = torch.randn(5000, 64, generator=torch.Generator().manual_seed(1))
    head = FloatMatmul(table.t().contiguous())
    moved = table.clone()
    moved[4999, 63] += 1e-3  # the very last value
    assert not head.holds_transpose_of(moved)
    assert not head.holds_transpose_of(table.half())
    assert not head.holds_transpose_of(table[:4999])


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """A tied LFM2 checkpoint (transformers' save_pretrained) exported fp32 with the table shared,
    and again with the sharing switched off."""
    root = tmp_path_factory.mktemp("tied")
    folder = hf.write_lfm2(root / "ckpt", replace(hf.Lfm2Dims(), vocab=2048), seed=3)
    shared = export(str(folder), str(root / "shared"), quant="fp32", progress=False)
    keep = convert.store_tied_table_once
    convert.store_tied_table_once = lambda lm, builder: False
    try:
        twice = export(str(folder), str(root / "twice"), quant="fp32", gate=False, progress=False)
    finally:
        convert.store_tied_table_once = keep
    return shared, twice


def test_the_tied_table_is_stored_once(bundles):
    shared, twice = bundles
    table_bytes = 2048 * 48 * 4
    (entry,) = [t for t in shared.manifest.plan["tensors"] if t["role"] == "embedding"]
    assert (entry["bytes"], entry["shares"], entry["shape"]) == (0, "lm_head.weight", [2048, 48])
    assert twice.manifest.plan["summary"]["total"] - shared.manifest.plan["summary"]["total"] == table_bytes
    saved = twice.manifest.asset.bytes - shared.manifest.asset.bytes
    assert 0.9 * table_bytes < saved <= table_bytes
    assert shared.gate_headline.startswith("PASS")


def test_the_shared_table_gives_the_same_logits(bundles):
    """Prefill (a chunk's ids read from the head) and decode, against the bundle storing both."""
    prompt, tokens = [5, 2047, 1024, 3, 3, 700], [1, 2046, 1023, 64]
    got = []
    for result in bundles:
        with Runner(result.path) as runner:
            got.append(np.vstack([runner.feed(prompt)[None], runner.step_each(tokens)]))
    np.testing.assert_array_equal(got[0], got[1])


def test_an_untied_head_keeps_its_own_table(tmp_path):
    folder = hf.write_lfm2(tmp_path / "ckpt", replace(hf.Lfm2Dims(), tied=False), seed=3)
    result = export(str(folder), str(tmp_path / "out"), quant="fp32", gate=False, prefill_chunk=None, progress=False)
    (entry,) = [t for t in result.manifest.plan["tensors"] if t["role"] == "embedding"]
    assert entry["bytes"] == 96 * 48 * 4 and "shares" not in entry


def test_inspect_says_where_the_table_is(bundles, capsys):
    from ssmport.cli.main import main

    assert main(["inspect", str(bundles[0].path), "--plan"]) == 0
    out = capsys.readouterr().out
    assert "embedding" in out and "(read from lm_head.weight)" in out


# --- an int8 head (ssmport.quant.tied: the table read from its levels and scales) -------------

def _int8_head(table: torch.Tensor):
    from ssmport.ops.matmul import BlockwiseMatmul
    from ssmport.quant.blockwise import quantize_blockwise

    b = quantize_blockwise(table.t(), bits=8)
    return BlockwiseMatmul(b.q, b.scale), b


@pytest.mark.parametrize("vocab", [96, 5000])
def test_int8_head_columns_are_the_dequantized_table_rows(vocab):
    """The gathered levels times their scales, against the whole head dequantized and transposed."""
    from ssmport.quant.int8 import dequantize_int8_blockwise

    table = torch.randn(vocab, 64, generator=torch.Generator().manual_seed(vocab))
    head, b = _int8_head(table)
    ids = torch.tensor([0, 5, vocab // 2, vocab - 1, 5])
    assert torch.equal(head.columns(ids), dequantize_int8_blockwise(b.q, b.scale).t()[ids])


def test_an_int8_head_holds_only_the_table_it_was_quantized_from():
    from ssmport.ops.matmul import BlockwiseMatmul
    from ssmport.quant.blockwise import quantize_blockwise
    from ssmport.quant.tied import quantizes_to

    table = torch.randn(5000, 64, generator=torch.Generator().manual_seed(2))
    head, _ = _int8_head(table)
    assert quantizes_to(table, head)
    moved = table.clone()
    moved[4999, 63] += 0.05  # the very last value: its level moves
    assert not quantizes_to(moved, head)
    assert not quantizes_to(table[:4999], head)
    four = quantize_blockwise(table.t(), bits=4)  # the same table at 4 bits, and affine at 8
    affine = quantize_blockwise(table.t(), bits=8, affine=True)
    assert not quantizes_to(table, BlockwiseMatmul(four.q, four.scale, bits=4))
    assert not quantizes_to(table, BlockwiseMatmul(affine.q, affine.scale, affine.zero_point))


INT8_DIMS = replace(hf.Lfm2Dims(), vocab=2048, hidden=64)  # a width of whole blocks: the head is int8
EMBED = "model.embed_tokens.weight"


def _embedding_entry(entries) -> dict:
    """The embedding's plan entry, from a manifest's plan or a builder's entries."""
    (entry,) = [e if isinstance(e, dict) else e.to_json() for e in entries
                if (e["role"] if isinstance(e, dict) else e.role) == "embedding"]  # fmt: skip
    return entry


@pytest.fixture(scope="module")
def int8_folder(tmp_path_factory):
    return hf.write_lfm2(tmp_path_factory.mktemp("tied8") / "ckpt", INT8_DIMS, seed=3)


@pytest.fixture(scope="module")
def int8_bundles(int8_folder, tmp_path_factory):
    """int8keepproj three ways: the table read from the head (--int8-tied-table, gated), its own
    fp16 table (the recipe's default), and its own int8 table holding the head's levels (an
    `auto`-style per-tensor choice: the same numbers from a second copy)."""
    import ssmport.exporter.pipeline as pipeline
    from ssmport.quant import get_recipe

    root = tmp_path_factory.mktemp("tied8-bundles")
    shared = export(str(int8_folder), str(root / "shared"), quant="int8keepproj", int8_tied_table=True, progress=False)
    fp16 = export(str(int8_folder), str(root / "fp16"), quant="int8keepproj", gate=False, progress=False)
    own_int8 = replace(get_recipe("int8keepproj"), per_tensor=((EMBED, "int8"),))
    keep = pipeline.get_recipe
    pipeline.get_recipe = lambda name: own_int8
    try:
        int8 = export(str(int8_folder), str(root / "int8"), quant="int8keepproj", gate=False, progress=False)
    finally:
        pipeline.get_recipe = keep
    return shared, fp16, int8


def test_the_int8_tied_table_is_stored_once(int8_bundles):
    shared, fp16, int8 = int8_bundles
    entry = _embedding_entry(shared.manifest.plan["tensors"])
    assert (entry["bytes"], entry["shares"], entry["dtype"], entry["block"]) == (0, "lm_head.weight", "int8", 32)
    assert "shares" not in _embedding_entry(fp16.manifest.plan["tensors"])
    fp16_table, int8_table = 2048 * 64 * 2, 2048 * 64 + 2048 * 2 * 2  # levels + one fp16 scale per 32
    total = {name: b.manifest.plan["summary"]["total"] for name, b in zip(("shared", "fp16", "int8"), int8_bundles)}
    assert (total["fp16"] - total["shared"], total["int8"] - total["shared"]) == (fp16_table, int8_table)
    saved = fp16.manifest.asset.bytes - shared.manifest.asset.bytes
    assert 0.9 * fp16_table < saved <= fp16_table
    assert shared.gate_headline.startswith("PASS")


def test_the_int8_tied_table_gives_its_own_int8_tables_logits(int8_bundles):
    """Read from the head or from a table of its own holding the same levels and scales, the rows
    are the same numbers: prefill (a chunk's ids) and decode, bit for bit."""
    shared, _, int8 = int8_bundles
    prompt, tokens = [5, 2047, 1024, 3, 3, 700], [1, 2046, 1023, 64]
    got = []
    for result in (shared, int8):
        with Runner(result.path) as runner:
            got.append(np.vstack([runner.feed(prompt)[None], runner.step_each(tokens)]))
    np.testing.assert_array_equal(got[0], got[1])


def test_an_overridden_tied_table_is_recorded_and_the_gate_rebuilds_it(int8_folder, int8_bundles):
    """--int8-tied-table on int8keepproj (not its default) is written to the manifest, and the
    gate's torch module rebuilt from it (the recipe/runtime split) reads the table from the head."""
    from ssmport.bundle import Bundle
    from ssmport.gate.torch_runner import TorchRunner
    from ssmport.loader.resolve import load_model
    from ssmport.quant.recipes import INT8_TIED_TABLE, exported_recipe
    from ssmport.quant.tied import HeadColumns

    shared, fp16, _ = (Bundle.open(b.path).manifest for b in int8_bundles)
    assert shared.export[INT8_TIED_TABLE] is True and INT8_TIED_TABLE not in fp16.export
    model = load_model(str(int8_folder))
    for m, reads_the_head in ((shared, True), (fp16, False)):
        recipe = exported_recipe(m.recipe.name, m.export)
        assert recipe.int8_tied_table == reads_the_head
        runner = TorchRunner(model, recipe)
        assert isinstance(runner.module.embed.weight, HeadColumns) == reads_the_head
        runner.close()


@pytest.mark.parametrize("recipe, int8_tied_table, shared", [
    ("int4keepproj", None, True),  # the recipe's default
    ("int4keepproj", False, False),
    ("int8keepproj", None, False),
    ("int8", True, True),
    ("int4", None, False),  # a 4-bit head: a gather cannot read its packed levels
])  # fmt: skip
def test_which_recipes_read_the_table_from_the_int8_head(int8_folder, recipe, int8_tied_table, shared):
    """The stored plan as the export builds it (the build and the sharing step), no conversion."""
    entry = _embedding_entry(_built(int8_folder, recipe, int8_tied_table).entries)
    assert (entry.get("shares") == "lm_head.weight") == shared


def _built(folder, recipe: str, int8_tied_table: bool | None = None):
    """The WeightBuilder of `folder` built under `recipe` as convert builds it."""
    from ssmport.loader.resolve import load_model
    from ssmport.quant import get_recipe
    from ssmport.quant.plan import WeightBuilder
    from ssmport.quant.tied import store_tied_table_once

    model = load_model(str(folder))
    builder = WeightBuilder.for_architecture(get_recipe(recipe).with_int8_tied_table(int8_tied_table), model.architecture)
    with torch.no_grad():
        store_tied_table_once(model.architecture.build_decode(model.config, model.weights, builder, torch.float32), builder)
    return builder


def test_an_untied_int8_head_keeps_its_own_table(tmp_path):
    folder = hf.write_lfm2(tmp_path / "ckpt", replace(INT8_DIMS, tied=False), seed=3)
    entry = _embedding_entry(_built(folder, "int4keepproj").entries)
    assert entry["bytes"] == 2048 * 64 * 2 and "shares" not in entry


def test_an_untied_head_is_refused_before_torch_export(tmp_path, monkeypatch):
    """--int8-tied-table on an untied model: refused once the weights are built, before the
    export and conversion (minutes at released sizes); nothing left behind."""
    from ssmport.errors import SsmportError

    folder = hf.write_lfm2(tmp_path / "ckpt", replace(INT8_DIMS, tied=False), seed=3)

    def reached(*args, **kwargs):
        raise AssertionError("torch.export was reached")

    monkeypatch.setattr(convert, "_export_program", reached)
    with pytest.raises(SsmportError, match="LM head is not its embedding table"):
        export(str(folder), tmp_path / "out", quant="int8keepproj", int8_tied_table=True, gate=False, progress=False)
    assert not (tmp_path / "out").exists()


def test_int8_tied_table_needs_an_int8_head():
    from ssmport.errors import SsmportError
    from ssmport.exporter.options import ExportOptions

    for quant in ("fp32", "fp16", "int4"):
        with pytest.raises(SsmportError, match=f"which --quant {quant} does not store"):
            ExportOptions(quant=quant, int8_tied_table=True)
    ExportOptions(quant="int8keepproj", int8_tied_table=True)


# --- an `auto` plan (ssmport.quant.auto: the table read from the int8 head is one of its choices) ----

AUTO_DIMS = replace(INT8_DIMS, vocab=32768)  # a table large against the rest, as in a released model
# The smallest bundles of AUTO_DIMS (every matmul int4, 512 KB reserved): with the int8 head holding the
# table, and with the head and a table of its own both int4, V x C / 16 bytes more (one copy's scales).
AUTO_SMALLEST, AUTO_UNSHARED = 2_851_200, 2_982_272
AUTO_BUDGET = AUTO_UNSHARED - 1  # only the shared form fits; it leaves 128 KB to raise other matmuls


@pytest.fixture(scope="module")
def auto_folder(tmp_path_factory):
    return hf.write_lfm2(tmp_path_factory.mktemp("tied-auto") / "ckpt", AUTO_DIMS, seed=3)


@pytest.fixture(scope="module")
def auto_bundles(auto_folder, tmp_path_factory):
    """`--quant auto` at a budget only the shared table meets (gated), and the same plan with an
    int8 table of its own (the levels and scales the head holds, stored a second time; not gated)."""
    import ssmport.exporter.pipeline as pipeline
    from ssmport.quant import get_recipe
    from ssmport.quant.auto import SHARED

    root = tmp_path_factory.mktemp("tied-auto-bundles")
    shared = export(str(auto_folder), str(root / "shared"), quant="auto", size_budget=str(AUTO_BUDGET),
                    prefill_chunk=None, progress=False)  # fmt: skip
    chosen = ((g["group"], "int8" if g["chosen"] == SHARED else g["chosen"])
              for g in shared.manifest.plan["auto"]["sensitivity"])  # tensor granularity: a group is a tensor
    own = replace(get_recipe("auto"), name="int4", per_tensor=tuple(sorted(chosen)))  # no `auto` measuring again
    keep = pipeline.get_recipe
    pipeline.get_recipe = lambda name: own
    try:
        int8 = export(str(auto_folder), str(root / "int8"), quant="int4", gate=False, prefill_chunk=None,
                      progress=False)  # fmt: skip
    finally:
        pipeline.get_recipe = keep
    return shared, int8


def test_auto_under_a_budget_only_sharing_meets_reads_the_table_from_the_int8_head(auto_bundles):
    shared, int8 = auto_bundles
    m = shared.manifest
    auto = m.plan["auto"]
    assert AUTO_UNSHARED - AUTO_SMALLEST == 32768 * 64 // 16
    assert m.asset.bytes <= AUTO_BUDGET
    assert m.plan["summary"]["total"] == auto["plan_bytes"] <= AUTO_BUDGET - auto["reserved_for_graph_bytes"]
    int8_head = 32768 * 64 + 32768 * 2 * 2  # levels + one fp16 scale per 32
    head = next(e for e in m.plan["tensors"] if e["name"] == "lm_head.weight")
    assert (head["dtype"], head["bytes"]) == ("int8", int8_head)
    entry = _embedding_entry(m.plan["tensors"])
    assert (entry["bytes"], entry["shares"], entry["dtype"], entry["block"]) == (0, "lm_head.weight", "int8", 32)
    rows = {g["group"]: g for g in auto["sensitivity"]}
    assert auto["tied"] == {"head": "lm_head.weight", "table": EMBED}
    assert (rows["lm_head.weight"]["chosen"], rows[EMBED]["chosen"], rows[EMBED]["bytes"]["shared"]) == ("int8", "shared", 0)
    # the table held once: the same plan with an int8 table of its own stores it again, in the asset too
    assert int8.manifest.plan["summary"]["total"] - m.plan["summary"]["total"] == int8_head
    assert 0.9 * int8_head < int8.manifest.asset.bytes - m.asset.bytes <= int8_head
    assert m.gate.passed, shared.gate_headline


def test_the_auto_shared_table_gives_its_own_int8_tables_logits(auto_bundles):
    """Read from the head or from an int8 table of its own (ops.matmul.QuantizedTable, another
    path to the same levels and scales), the Core AI runtime gives the same logits, bit for bit."""
    prompt, tokens = [5, 32767, 1024, 3], [1, 32766, 16383, 64]
    got = []
    for result in auto_bundles:
        with Runner(result.path) as runner:
            got.append(np.vstack([runner.feed(prompt)[None], runner.step_each(tokens)]))
    np.testing.assert_array_equal(got[0], got[1])


def test_inspect_shows_the_auto_table_read_from_the_head(auto_bundles, capsys):
    from ssmport.cli.main import main

    assert main(["inspect", str(auto_bundles[0].path)]) == 0
    out = capsys.readouterr().out
    assert "(read from lm_head.weight)" in out
    row = next(line for line in out.splitlines() if line.strip().startswith(EMBED))
    assert row.split()[1:3] == ["shared", "0"]


@pytest.mark.parametrize("flags, smallest", [
    ((), f"{AUTO_SMALLEST:,} bytes (2.72 MB: every matmul int4 but the tied LM head int8, the table read from it"),
    (("--no-int8-tied-table",), f"{AUTO_UNSHARED:,} bytes (2.84 MB: every matmul and table int4"),
])  # fmt: skip
def test_a_budget_below_the_smallest_names_it(auto_folder, tmp_path, capsys, flags, smallest):
    from ssmport.cli.main import main

    argv = ["export", str(auto_folder), "-o", str(tmp_path), "-q", "--quant", "auto",
            "--size-budget", str(AUTO_SMALLEST - 1), *flags]  # fmt: skip
    assert main(argv) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"bundle auto can make: {smallest}" in err, err
    assert not any(tmp_path.iterdir())
