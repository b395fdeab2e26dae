"""Falcon-H1 features against transformers' `FalconH1ForCausalLM` (ssmport's fp32 module in
torch; the Core AI bundle, states, prefill, int8keepproj and strict loading are
tests/test_hybrid_models.py's): every µP multiplier, the three Mamba output-norm orders, a tied
head, the projection biases, a stored mup_vector, and the one-line refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hybrid_checks import assert_config_refused, TOKENS, assert_close_to, differs, eager_logits, rewrite, tensors_of, with_config

import hybrid_files as hf
from ssmport.architectures import get_architecture, presets
from ssmport.errors import CheckpointError
from ssmport.loader.resolve import load_checkpoint

SCALARS = ("embedding_multiplier", "lm_head_multiplier", "attention_in_multiplier", "attention_out_multiplier",
           "key_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return hf.write_falcon_h1(tmp_path_factory.mktemp("falcon") / "falcon-h1", hf.FalconDims(), seed=6)


@pytest.fixture(scope="module")
def theirs(folder):
    return hf.reference_run(folder, TOKENS).step_logits.numpy()


@pytest.fixture(scope="module")
def model(folder):
    return load_checkpoint(folder)


def test_the_multipliers_are_applied_where_transformers_applies_them(model, theirs):
    assert model.config.mixer.intermediate_size == 60 != 2 * model.config.hidden_size  # mamba_d_ssm, not expand * H
    assert_close_to(eager_logits(model, TOKENS), theirs)


@pytest.mark.parametrize("multiplier", SCALARS + ("mlp_multipliers", "ssm_multipliers"))
def test_each_multiplier_is_read_and_matters(model, theirs, multiplier):
    """The fixture's value (not 1) is read from config.json, and ignoring it (1 instead) puts
    ssmport far from transformers: the parity above fails if any one is ignored."""
    given = hf.FalconDims().multipliers[multiplier]
    assert getattr(model.config, multiplier) == (tuple(given) if isinstance(given, list) else given)
    ones = (1.0,) * len(given) if isinstance(given, list) else 1.0
    assert ones != getattr(model.config, multiplier)
    assert differs(eager_logits(with_config(model, **{multiplier: ones}), TOKENS), theirs)


@pytest.mark.parametrize("rms_norm, before_gate, order", [(False, False, "none"), (True, True, "norm_first")])
def test_the_other_output_norm_orders_and_a_tied_head(tmp_path, rms_norm, before_gate, order):
    """mamba_rms_norm false: y * silu(z), no norm tensor (the 0.5B); norm before the gate. The
    fixture's own order (gate first) is the module fixture. Tied heads ride along."""
    d = replace(hf.FalconDims(), rms_norm=rms_norm, norm_before_gate=before_gate, tied=True)
    folder = hf.write_falcon_h1(tmp_path / order, d, seed=8)
    loaded = load_checkpoint(folder)
    assert loaded.config.gated_norm == order
    assert ("model.layers.0.mamba.norm.weight" in loaded.weights) == rms_norm
    assert "lm_head.weight" not in tensors_of(folder)
    assert_close_to(eager_logits(loaded, TOKENS), hf.reference_run(folder, TOKENS).step_logits)


def test_projection_biases(folder, tmp_path):
    """attention_bias (q/k/v/o), mamba_proj_bias (in_proj) with projectors_bias (out_proj): none
    released; the fixture's weights plus seeded biases, each scaled where transformers scales it."""
    tensors, g = tensors_of(folder), torch.Generator().manual_seed(9)
    suffixes = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "in_proj.weight", "out_proj.weight")
    for name in [n for n in tensors if n.endswith(suffixes)]:
        tensors[name.replace(".weight", ".bias")] = 0.1 * torch.randn(tensors[name].shape[0], generator=g)
    edit = lambda c: c.update(attention_bias=True, mamba_proj_bias=True, projectors_bias=True)  # noqa: E731
    biased = rewrite(folder, tmp_path / "bias", tensors, config_edit=edit)
    loaded = load_checkpoint(biased)
    assert "model.layers.1.self_attn.k_proj.bias" in loaded.weights and "model.layers.1.mamba.in_proj.bias" in loaded.weights
    assert_close_to(eager_logits(loaded, TOKENS), hf.reference_run(biased, TOKENS).step_logits)


def test_a_stored_mup_vector_is_accepted_and_follows_the_config(folder, model, theirs, tmp_path):
    size = model.config.mixer.in_proj_size
    stored = {f"model.layers.{i}.mamba.mup_vector": torch.full((1, 1, size), 7.0) for i in range(3)}
    loaded = load_checkpoint(rewrite(folder, tmp_path / "mup", tensors_of(folder) | stored))
    assert_close_to(eager_logits(loaded, TOKENS), theirs)
    bad = {"model.layers.0.mamba.mup_vector": torch.ones(size)}
    with pytest.raises(CheckpointError, match="mup_vector"):
        load_checkpoint(rewrite(folder, tmp_path / "bad-mup", tensors_of(folder) | bad))


def test_the_presets_build():
    arch = get_architecture("falcon_h1")
    names = [p.name for p in arch.presets]
    assert {"falcon-h1-1.5b-deep-base", "falcon-h1-7b-instruct", "falcon-h1-34b-base"} <= set(names)
    for name in names:
        cfg = arch.config_from_json(dict(presets()[name].config))
        cfg.validate()
        assert len(cfg.ssm_scale) == cfg.mixer.in_proj_size
    cfg = arch.config_from_json(dict(presets()["falcon-h1-0.5b-base"].config))
    assert (cfg.mixer.intermediate_size, cfg.mixer.in_proj_size, cfg.gated_norm) == (1536, 1536 * 2 + 256 + 24, "none")


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.update(hidden_act="gelu"), "hidden_act='gelu'"),
    (lambda c: c.update(mlp_bias=True), "mlp_bias=true"),
    (lambda c: c.update(projectors_bias=True), "projectors_bias != mamba_proj_bias"),
    (lambda c: c.update(time_step_limit=[0.001, 0.1]), "time_step_limit=[0.001, 0.1]"),
    (lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_type 'linear'"),
    (lambda c: c.update(mamba_d_head=8), "mamba_n_heads*mamba_d_head (6*8) != mamba_d_ssm (60)"),
    (lambda c: c.update(ssm_multipliers=[1.0, 1.0]), "ssm_multipliers=[1.0, 1.0] is not a list of 5 numbers"),
])  # fmt: skip
def test_unsupported_configs_are_refused_in_one_line(folder, tmp_path, edit, says):
    assert_config_refused(folder, tmp_path / "bad", edit, says)
