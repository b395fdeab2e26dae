"""Nemotron-H features against transformers' `NemotronHForCausalLM` (ssmport's fp32 module in
torch; the Core AI bundle is tests/test_hybrid_models.py's): the layer pattern in both
spellings, the dt-clamp decision (config.py), both tensor prefixes, the presets' sizes and the
one-line refusals (MoE first)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hybrid_checks import assert_config_refused, TOKENS, assert_close_to, differs, eager_logits, eager_prefill_logits, rewrite, tensors_of

import hybrid_files as hf
from ssmport.architectures import get_architecture, presets
from ssmport.errors import CheckpointError
from ssmport.loader.resolve import load_checkpoint


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return hf.write_nemotron_h(tmp_path_factory.mktemp("nemotron") / "nemotron-h", hf.NemotronDims(), seed=5)


@pytest.fixture(scope="module")
def theirs(folder):
    return hf.reference_run(folder, TOKENS).step_logits.numpy()


def test_the_layer_pattern_is_followed(folder, theirs, tmp_path):
    moved = hf.write_permuted(folder, tmp_path / "moved", [0, 2, 1, 3, 4, 5, 6])
    model = load_checkpoint(moved)
    assert model.config.pattern == "M-*M-*M"
    ours = eager_logits(model, TOKENS)
    assert_close_to(ours, hf.reference_run(moved, TOKENS).step_logits)
    assert differs(ours, theirs)


def test_a_layers_block_type_list_is_the_same_model(folder, theirs, tmp_path):
    """What transformers 5 writes on save; it wins over a pattern string, as in transformers."""
    kinds = hf.layer_types_of({"hybrid_override_pattern": "M*-M-*M"})
    listed = rewrite(folder, tmp_path / "listed", config_edit=lambda c: c.update(
        layers_block_type=kinds, hybrid_override_pattern="MMMMMMM"))  # fmt: skip
    model = load_checkpoint(listed)
    assert model.config.pattern == "M*-M-*M"
    assert_close_to(eager_logits(model, TOKENS), theirs)


def test_model_prefix_loads_the_same_weights(folder, theirs, tmp_path):
    renamed = {("model." + k.removeprefix("backbone.") if k.startswith("backbone.") else k): v
               for k, v in tensors_of(folder).items()}  # fmt: skip
    assert_close_to(eager_logits(load_checkpoint(rewrite(folder, tmp_path / "model", renamed)), TOKENS), theirs)


@torch.no_grad()
def test_dt_is_not_clamped_at_time_step_min(folder, tmp_path):
    """With softplus(dt + dt_bias) ~ 1e-5 < time_step_min, transformers' chunked path (which
    clamps at time_step_min) and its one-token update (which does not) part. ssmport's decode
    and prefill both equal transformers with the clamp lifted, i.e. its one-token update
    (config.py says why). transformers' own token-by-token run is no reference here: its
    first token, with an empty cache, takes the chunked path."""
    tensors = tensors_of(folder)
    tensors |= {k: torch.full_like(v, -12.0) for k, v in tensors.items() if k.endswith("mixer.dt_bias")}
    small = rewrite(folder, tmp_path / "small-dt", tensors)
    model = hf.load_transformers(small)
    clamped = model(torch.tensor([TOKENS]), use_cache=False).logits[0].numpy()
    for layer in model.model.layers:
        if layer.block_type == "linear_attention":
            layer.mixer.time_step_limit = (0.0, float("inf"))
    unclamped = hf.reference_run(small, TOKENS, model=model).step_logits.numpy()  # both paths agree again
    assert differs(clamped, unclamped)
    ours = load_checkpoint(small)
    decoded = eager_logits(ours, TOKENS)
    assert_close_to(decoded, unclamped)
    assert differs(decoded, clamped)
    prefilled = eager_prefill_logits(ours, TOKENS)
    assert np.abs(prefilled - unclamped[-1]).max() <= 1e-4 * np.abs(unclamped).max()


@pytest.mark.parametrize("name, params", [("nemotron-h-4b", 3_973_556_832)])
def test_presets_have_the_released_sizes(name, params):
    arch = get_architecture("nemotron_h")
    shapes = arch.canonical_shapes(arch.config_from_json(dict(presets()[name].config)))
    assert sum(math.prod(s) for s in shapes.values()) == params  # untied


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.update(hybrid_override_pattern="M*E-M-*", moe_latent_size=16), "moe_latent_size=16 (a latent expert"),
    (lambda c: c.update(hybrid_override_pattern="M*X-M-*"), "unknown layer kind(s) ['X']"),
    (lambda c: c.update(attention_head_dim=12), "attention_head_dim=12 != head_dim=16"),
    (lambda c: c.update(time_step_limit=[0.0, 0.1]), "time_step_limit=[0, 0.1]"),
    (lambda c: c.update(mlp_hidden_act="silu"), "mlp_hidden_act='silu'"),
    (lambda c: c.update(use_bias=True), "Mamba projection biases"),
    (lambda c: c.update(rms_norm_eps=1e-6), "rms_norm_eps=1e-06 != layer_norm_epsilon=1e-05"),
])  # fmt: skip
def test_unsupported_configs_are_refused_in_one_line(folder, tmp_path, edit, says):
    assert_config_refused(folder, tmp_path / "bad", edit, says)


def test_a_missing_head_is_refused(folder, tmp_path):
    """transformers ties nothing for Nemotron-H: a folder without lm_head.weight is refused."""
    bad = rewrite(folder, tmp_path / "headless", {k: v for k, v in tensors_of(folder).items() if k != "lm_head.weight"})
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        load_checkpoint(bad)
