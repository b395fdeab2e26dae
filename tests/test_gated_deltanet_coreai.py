"""Gated DeltaNet bundles executed on the Core AI runtime, against transformers' Qwen3-Next
torch functions (independent of ssmport), plus the decode contract and the CLI."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ir_checks import writes_per_state
from gdn_files import GDNDims, transformers_reference_logits, write_gdn_folder
from ssmport.cli.main import main
from ssmport.exporter.convert import convert
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_checkpoint

TOKENS = [1, 5, 77, 3, 3, 300, 12, 9, 0, 383, 44, 44, 44, 2, 100, 7]
DIMS = GDNDims()  # GVA (4 value heads on 2 q/k heads), dk 16 != dv 24


@pytest.fixture(scope="module")
def gdn_folder(tmp_path_factory):
    return write_gdn_folder(tmp_path_factory.mktemp("gdn") / "gdn-gva", DIMS, seed=21, shards=2)


@pytest.fixture(scope="module")
def gdn_bundle(gdn_folder, tmp_path_factory):
    from ssmport.exporter.pipeline import export

    return export(str(gdn_folder), tmp_path_factory.mktemp("gdn-bundles"), quant="fp32", gate_steps=6, progress=False)


def test_fp32_bundle_matches_transformers_reference(gdn_bundle, gdn_folder):
    with Runner(gdn_bundle.path) as runner:
        ours = runner.step_each(TOKENS)
    theirs = transformers_reference_logits(gdn_folder, TOKENS).numpy()
    assert ours.dtype == np.float32 and ours.shape == (len(TOKENS), DIMS.vocab)
    assert np.abs(theirs - ours).max() < 2e-3
    assert np.abs(theirs - ours).max() / max(1.0, np.abs(theirs).max()) < 1e-4
    assert (theirs.argmax(-1) == ours.argmax(-1)).all()


def test_contract_names_order_shapes(gdn_bundle):
    m = gdn_bundle.manifest
    assert m.architecture == "gated_deltanet" and m.gate.passed
    L, W, D = DIMS.layers, DIMS.conv, 2 * DIMS.heads * DIMS.head_dim + DIMS.v_heads * DIMS.dv
    assert [(t.name, list(t.shape), t.dtype) for t in m.main.inputs] == [
        ("input_ids", [1, 1], "int32"),
        ("position_ids", [1, 1], "int32"),
    ]
    assert [(t.name, list(t.shape), t.dtype) for t in m.states] == [
        ("convState", [L, 1, W - 1, D], "float32"),
        ("recState", [L, 1, DIMS.v_heads, DIMS.head_dim, DIMS.dv], "float32"),
    ]
    assert [(t.name, list(t.shape)) for t in m.main.outputs] == [("logits", [1, 1, DIMS.vocab])]
    with Runner(gdn_bundle.path) as runner:
        d = runner._fn.desc
        assert list(d.input_names) == ["input_ids", "position_ids"]
        assert list(d.state_names) == ["convState", "recState"]
        assert list(d.output_names) == ["logits"]


def test_each_state_written_once_in_ir(gdn_folder):
    model = load_checkpoint(gdn_folder)
    program = convert(model, WeightBuilder(get_recipe("fp32"), model.architecture.keeps_float), torch.float32).program
    assert writes_per_state(program) == {"convState": 1, "recState": 1}


def test_int8keepproj_bundle_gated(gdn_folder, tmp_path):
    from ssmport.exporter.pipeline import export

    result = export(str(gdn_folder), tmp_path, quant="int8keepproj", gate_steps=4, progress=False)
    assert result.manifest.gate.passed, result.manifest.gate
    kinds = {e["name"]: e["dtype"] for e in result.manifest.plan_tensors}
    assert kinds["lm_head.weight"] == "int8" and kinds["model.layers.0.mlp.down_proj.weight"] == "int8"
    assert kinds["model.layers.0.attn.{q,k,v,a,b,g}_proj.weight"] == "float16"


def test_cli_logits_generate_inspect(gdn_bundle, gdn_folder, tmp_path, capsys):
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(map(str, TOKENS)))
    out, torch_out = tmp_path / "coreai.npy", tmp_path / "torch.npy"
    assert main(["logits", str(gdn_bundle.path), "--tokens-file", str(ids), "--out", str(out)]) == 0
    assert main(["logits", str(gdn_bundle.path), "--tokens-file", str(ids), "--out", str(torch_out),
                 "--backend", "torch"]) == 0  # fmt: skip
    got = np.load(out)
    assert np.abs(np.load(torch_out) - got).max() < 1e-4
    assert np.abs(transformers_reference_logits(gdn_folder, TOKENS).numpy() - got).max() < 2e-3
    capsys.readouterr()
    assert main(["generate", str(gdn_bundle.path), "--tokens", "1,2,3", "-n", "4"]) == 0
    generated = [int(x) for x in capsys.readouterr().out.strip().split(",")]
    assert len(generated) == 4 and all(0 <= i < DIMS.vocab for i in generated)
    assert main(["inspect", str(gdn_bundle.path)]) == 0
    shown = capsys.readouterr().out
    assert "convState" in shown and "recState" in shown and "gate: PASS" in shown
