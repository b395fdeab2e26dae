"""Granite-4.0-H features against transformers' `GraniteMoeHybridForCausalLM` (ssmport's fp32
module in torch; the Core AI bundle is tests/test_hybrid_models.py's): each of the four
multipliers, "nope" vs "rope", the layer pattern, an all-Mamba stack, the presets' sizes and
the one-line refusals (routed experts first)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hybrid_checks import assert_config_refused, TOKENS, assert_close_to, differs, eager_logits, rewrite, tensors_of, with_config

import hybrid_files as hf
from ssmport.architectures import get_architecture, presets
from ssmport.loader.resolve import load_checkpoint

MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return hf.write_granite_h(tmp_path_factory.mktemp("granite") / "granite-h", hf.GraniteDims(), seed=4)


@pytest.fixture(scope="module")
def theirs(folder):
    return hf.reference_run(folder, TOKENS).step_logits.numpy()


@pytest.fixture(scope="module")
def model(folder):
    return load_checkpoint(folder)


def test_the_multipliers_are_applied_where_transformers_applies_them(model, theirs):
    assert_close_to(eager_logits(model, TOKENS), theirs)


@pytest.mark.parametrize("multiplier", MULTIPLIERS)
def test_each_multiplier_is_read_and_matters(model, theirs, multiplier):
    """The fixture's value (not 1) is read from config.json, and ignoring it (1 instead) puts
    ssmport far from transformers: the parity above fails if any one is ignored."""
    assert getattr(model.config, multiplier) == hf.GraniteDims().multipliers[multiplier] != 1.0
    assert differs(eager_logits(with_config(model, **{multiplier: 1.0}), TOKENS), theirs)


def test_nope_means_no_positions_and_rope_means_rope(model, theirs, tmp_path):
    assert model.config.position_embedding == "nope" and model.config.attention.rotary_dim == 0
    assert differs(eager_logits(with_config(model, position_embedding="rope"), TOKENS), theirs)
    rope = hf.write_granite_h(tmp_path / "rope", replace(hf.GraniteDims(), position_embedding_type="rope"), seed=4)
    loaded = load_checkpoint(rope)
    assert loaded.config.attention.rotary_dim == loaded.config.head_dim
    assert_close_to(eager_logits(loaded, TOKENS), hf.reference_run(rope, TOKENS).step_logits)


def test_the_layer_pattern_is_followed(folder, theirs, tmp_path):
    moved = hf.write_permuted(folder, tmp_path / "moved", [1, 0, 2, 3, 4])
    model = load_checkpoint(moved)
    assert model.config.layer_types[:2] == ("full_attention", "linear_attention")
    ours = eager_logits(model, TOKENS)
    assert_close_to(ours, hf.reference_run(moved, TOKENS).step_logits)
    assert differs(ours, theirs)


def test_attention_biases(folder, tmp_path):
    """attention_bias: q/k/v/o biases (none released; the fixture's weights plus seeded biases)."""
    tensors, g = tensors_of(folder), torch.Generator().manual_seed(9)
    for name in [n for n in tensors if n.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"))]:
        tensors[name.replace(".weight", ".bias")] = 0.1 * torch.randn(tensors[name].shape[0], generator=g)
    biased = rewrite(folder, tmp_path / "bias", tensors, config_edit=lambda c: c.update(attention_bias=True))
    model = load_checkpoint(biased)
    assert model.config.attention_bias and "model.layers.1.self_attn.o_proj.bias" in model.weights
    assert_close_to(eager_logits(model, TOKENS), hf.reference_run(biased, TOKENS).step_logits)


def test_an_all_mamba_stack_declares_no_kv_states(tmp_path):
    folder = hf.write_granite_h(tmp_path / "mamba", replace(hf.GraniteDims(), layer_types=("mamba",) * 3), seed=7)
    model = load_checkpoint(folder)
    specs = model.architecture.state_specs(model.config, torch.float32)
    assert [s.name for s in specs] == ["convStates", "recurrentStates"]
    # transformers' cache cannot step a stack without attention (get_seq_length refuses): its full forward
    assert_close_to(eager_logits(model, TOKENS), hf.full_logits(folder, TOKENS))


@pytest.mark.parametrize("name, params", [("granite-4.0-h-350m", 340_332_224), ("granite-4.0-h-1b", 1_461_538_368)])
def test_presets_have_the_released_sizes(name, params):
    arch = get_architecture("granitemoehybrid")
    shapes = arch.canonical_shapes(arch.config_from_json(dict(presets()[name].config)))
    assert sum(math.prod(s) for n, s in shapes.items() if n != "lm_head.weight") == params  # tied


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.update(num_local_experts=8, num_experts_per_tok=9), "num_experts_per_tok 9 is not in [1, num_experts=8]"),
    (lambda c: c.update(time_step_limit=[0.001, 0.1]), "time_step_limit=[0.001, 0.1]"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act='gelu'"),
    (lambda c: c.update(position_embedding_type="alibi"), "position_embedding_type='alibi'"),
    (lambda c: c.update(layer_types=["mamba", "attention", "mamba", "mamba2", "attention"]), "'mamba2'"),
    (lambda c: c.update(mamba_d_head=8), "mamba_n_heads*mamba_d_head (6*8) != mamba_expand*hidden_size (96)"),
])  # fmt: skip
def test_unsupported_configs_are_refused_in_one_line(folder, tmp_path, edit, says):
    assert_config_refused(folder, tmp_path / "bad", edit, says)
