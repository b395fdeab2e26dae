"""LFM2 features against transformers' `Lfm2ForCausalLM` (ssmport's fp32 module in torch; the
Core AI bundle is tests/test_hybrid_models.py's): both config spellings, conv biases, the layer
pattern, the MLP width rule, the presets' sizes and the one-line refusals."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hybrid_checks import assert_config_refused, TOKENS, assert_close_to, differs, eager_logits, rewrite

import hybrid_files as hf
from ssmport.architectures import get_architecture, presets
from ssmport.cli.main import main
from ssmport.models.lfm2.config import mlp_width
from ssmport.loader.resolve import load_checkpoint


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("lfm2")
    return {"lfm2": hf.write_lfm2(root / "lfm2", hf.Lfm2Dims(), seed=3),
            "legacy": hf.write_lfm2(root / "legacy", hf.Lfm2Dims(), seed=3, legacy_keys=True)}  # fmt: skip


@pytest.fixture(scope="module")
def theirs(folders):
    return hf.reference_run(folders["lfm2"], TOKENS).step_logits.numpy()


def test_legacy_keys_load_the_same_model(folders, theirs):
    legacy = load_checkpoint(folders["legacy"])
    assert legacy.config == load_checkpoint(folders["lfm2"]).config
    assert_close_to(eager_logits(legacy, TOKENS), theirs)


def test_conv_biases(tmp_path):
    folder = hf.write_lfm2(tmp_path / "bias", replace(hf.Lfm2Dims(), conv_bias=True), seed=6)
    model = load_checkpoint(folder)
    assert model.config.conv_bias and "model.layers.0.conv.conv.bias" in model.weights
    assert_close_to(eager_logits(model, TOKENS), hf.reference_run(folder, TOKENS).step_logits)


def test_the_layer_pattern_is_followed(folders, theirs, tmp_path):
    """Layers 1 (conv) and 2 (attention) swapped: ssmport follows the moved kinds (in either
    spelling), which changes the logits."""
    for spelling in ("lfm2", "legacy"):
        moved = hf.write_permuted(folders[spelling], tmp_path / spelling, [0, 2, 1, 3, 4])
        model = load_checkpoint(moved)
        assert model.config.layer_types == ("conv", "full_attention", "conv", "conv", "full_attention")
        ours = eager_logits(model, TOKENS)
        assert_close_to(ours, hf.reference_run(moved, TOKENS).step_logits)
        assert differs(ours, theirs)


def test_mlp_width_follows_transformers():
    assert mlp_width(128, True, 1.0, 16) == 96  # the fixture: int(2*128/3) = 85 -> 96
    assert mlp_width(128, True, None, 16) == 85  # no multiplier: no rounding (mlx-lm rounds anyway)
    assert mlp_width(6656, True, 1.0, 256) == 4608  # LFM2-350M
    assert mlp_width(12288, True, 1.0, 256) == 8192  # LFM2-1.2B
    assert mlp_width(10752, False, 1.0, 256) == 10752  # LFM2-2.6B: auto-adjust off


@pytest.mark.parametrize("name, params", [("lfm2-350m", 354_483_968), ("lfm2-700m", 742_489_344),
                                          ("lfm2-1.2b", 1_170_340_608), ("lfm2-2.6b", 2_569_272_320)])  # fmt: skip
def test_presets_have_the_released_sizes(name, params):
    """Parameters of each preset (the tied head once) = the count on the model card."""
    arch = get_architecture("lfm2")
    shapes = arch.canonical_shapes(arch.config_from_json(dict(presets()[name].config)))
    total = sum(math.prod(s) for n, s in shapes.items() if n != "lm_head.weight")
    assert total == params


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.update(model_type="lfm2_vl", architectures=["Lfm2VlForConditionalGeneration"]), "model_type 'lfm2_vl' is not"),
    (lambda c: c.update(architectures=["Lfm2MoeForCausalLM"]), "experts (lfm2_moe"),  # a model_type that says lfm2
    (lambda c: c.update(layer_types=["conv", "conv", "sliding_attention", "conv", "full_attention"]), "'sliding_attention'"),
    (lambda c: c.update(num_hidden_layers=4), "5 layer_types for num_hidden_layers=4"),
    (lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}), "rope_type 'yarn'"),
    (lambda c: c.update(block_dim=64), "block_dim=64 != hidden_size=48"),
])  # fmt: skip
def test_unsupported_configs_are_refused_in_one_line(folders, tmp_path, edit, says):
    assert_config_refused(folders["lfm2"], tmp_path / "bad", edit, says)


def test_cli_refuses_lfm2_vl_in_one_line(folders, tmp_path, capsys):
    """Refused by the registry (its model_type is claimed by no architecture): for a Hub repo,
    before any weights are downloaded. (`lfm2_moe` is tests/test_moe.py's.)"""
    bad = rewrite(folders["lfm2"], tmp_path / "vl", config_edit=lambda c: c.update(
        model_type="lfm2_vl", architectures=["Lfm2VlForConditionalGeneration"]))  # fmt: skip
    assert main(["export", str(bad), "-o", str(tmp_path / "out"), "-q"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("ssmport: error:") and "lfm2_vl" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_context_is_bounded_by_the_trained_length(folders):
    assert json.loads((folders["lfm2"] / "config.json").read_text())["max_position_embeddings"] == 256
    assert load_checkpoint(folders["lfm2"]).config.context == 256  # min(4096, max_position_embeddings)
    assert get_architecture("lfm2").config_from_json(dict(presets()["lfm2-350m"].config)).context == 4096
