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
