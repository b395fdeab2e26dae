"""RecurrentGemma against transformers' `RecurrentGemmaForCausalLM` (tests/recurrent_gemma_files.py:
a window of 8 and a 40-token stream, so the attention ring wraps five times): the reference
loop, the export form in torch, the fp32 bundle on the Core AI runtime, prefill against the
M=1 loop, the constant state, int8keepproj, and the one-line refusals."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hybrid_checks import (assert_config_refused, CORE_AI_ATOL, EAGER_RTOL, Family, assert_chat_reuses_and_rewinds, assert_close_to, chat_template,
                           differs, rewrite, tensors_of)  # fmt: skip
from prefill_checks import assert_coreai_prefill_equals_m1_loop, assert_snapshot_restores

import recurrent_gemma_files as rf
from ssmport.errors import CheckpointError
from ssmport.exporter.pipeline import export
from ssmport.quant.roles import Role
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_checkpoint
from ssmport.tokenizers import load_tokenizer

CHUNK = 32  # prefill chunk: 4 windows, and two of the RG-LRU's 16-token pairwise blocks


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return rf.write(tmp_path_factory.mktemp("recurrent_gemma") / "tiny", seed=3)


@pytest.fixture(scope="module")
def model(folder):
    return load_checkpoint(folder)


@pytest.fixture(scope="module")
def theirs(folder):
    return rf.full_logits(folder, rf.TOKENS).numpy()


def reference_logits(model, tokens=rf.TOKENS, embedding_factor: float = 1.0) -> np.ndarray:
    ref = model.architecture.reference(model.config, model.weights)
    ref.w["model.embed_tokens.weight"] = ref.w["model.embed_tokens.weight"] * embedding_factor
    state = ref.zero_state()
    return torch.stack([ref.step(t, state) for t in tokens]).numpy()


def test_the_reference_loop_equals_transformers(model, theirs):
    assert model.config.layer_types == ("recurrent", "attention", "recurrent", "recurrent", "attention")
    assert (model.config.lru_width, model.config.head_dim, model.config.rotary_dim, model.config.window) == (40, 24, 12, 8)
    assert_close_to(reference_logits(model), theirs)


def test_the_window_and_the_bf16_embedding_scale_are_transformers(model, theirs):
    """A wider window changes the logits once the stream passes 8 tokens (so the mask is
    exercised); sqrt(H) is rounded to bf16 as transformers' `normalizer` holds it."""
    wide = reference_logits(replace(model, config=replace(model.config, window=64)))
    assert not differs(wide[:8], theirs[:8]) and differs(wide, theirs)
    assert model.config.embed_scale == 9.8125 != 96**0.5
    unrounded = reference_logits(model, embedding_factor=96**0.5 / 9.8125)
    assert np.abs(unrounded - theirs).max() > 10 * EAGER_RTOL * np.abs(theirs).max()  # measured: 0.035 vs a bound of 8.5e-4
    big = replace(model.config, hidden_size=2560)
    assert big.embed_scale == 50.5 and abs(2560**0.5 - 50.596) < 1e-3


@pytest.mark.parametrize("edit, says", [
    (lambda c: c.update(hidden_activation="gelu"), "hidden_activation 'gelu'"),
    (lambda c: c.update(block_types=["recurrent", "mlp"]), "block_types=['recurrent', 'mlp']"),
    (lambda c: c.update(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}), "rope_type 'linear'"),
    (lambda c: c.update(lru_width=42), "lru_width=42 not a multiple of num_attention_heads=4"),
    (lambda c: c["rope_parameters"].update(partial_rotary_factor=1.5), "partial_rotary_factor=1.5 (above 1)"),
    (lambda c: c.update(num_hidden_layers=4), "config.json says 4 layers but the checkpoint holds 5"),
])  # fmt: skip
def test_unsupported_configs_are_refused_in_one_line(folder, tmp_path, edit, says):
    assert_config_refused(folder, tmp_path / "bad", edit, says)


def test_loading_is_strict(folder, tmp_path):
    tensors = tensors_of(folder)
    del tensors["model.layers.1.temporal_block.o_proj.bias"]
    tensors["model.layers.0.temporal_block.extra"] = torch.zeros(3)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(rewrite(folder, tmp_path / "strict", tensors=tensors))
    assert "o_proj.bias" in str(info.value) and "temporal_block.extra" in str(info.value)


@pytest.fixture(scope="module")
def bundle(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundles")
    return export(str(folder), out, quant="fp32", gate_steps=6, prefill_chunk=CHUNK, context=64, progress=False)


def test_fp32_bundle_matches_transformers(bundle, theirs):
    """The M=1 loop on the Core AI runtime over 40 tokens: the window-8 rings wrap five times."""
    assert bundle.manifest.gate.passed
    with Runner(bundle.path, prefill=False) as runner:
        assert runner.state_names == ["slidingKeyCache", "slidingValueCache", "convStates", "recurrentStates"]
        ours = runner.step_each(rf.TOKENS)
    assert np.abs(ours - theirs).max() <= CORE_AI_ATOL
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


@pytest.mark.parametrize("n", [1, 7, 8, 9, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 5])
def test_prefill_equals_the_m1_loop(bundle, n):
    """Lengths around the window (8) and the chunk (32): a chunk writes its last 8 rows to the ring."""
    assert_coreai_prefill_equals_m1_loop(bundle.path, n, chunk=CHUNK)


def test_a_snapshot_restores_exactly_across_a_wrap(bundle, tmp_path):
    """Taken after 11 tokens (the rings wrapped once), restored after 6 more were fed."""
    assert_snapshot_restores(bundle.path, rf.TOKENS[:11], rf.TOKENS[11:15], rf.TOKENS[20:26], tmp_path / "snap")


def test_int8keepproj_passes_and_the_state_does_not_grow_with_the_context(bundle, folder, tmp_path):
    """Exported at --context 4096 (the fp32 bundle at 64): the same states, byte for byte in
    size, and no kv state; the recurrence's inputs stay float."""
    result = export(str(folder), tmp_path, quant="int8keepproj", gate_steps=6, prefill_chunk=None, context=4096,
                    progress=False)  # fmt: skip
    assert result.manifest.gate.passed, result.gate_headline
    assert [(s.name, s.shape, s.kind) for s in result.manifest.states] == [(s.name, s.shape, s.kind) for s in bundle.manifest.states]
    assert result.manifest.fixed_state_bytes == bundle.manifest.fixed_state_bytes and not result.manifest.kv_states
    # [L_attn, 1, kv, window, head_dim], the slot axis growing up to the window (ssmport.growing_kv)
    assert [(s.full_shape, s.dynamic) for s in bundle.manifest.ring_states] == [((2, 1, 2, 8, 24), True)] * 2
    arch = load_checkpoint(folder).architecture
    plan = result.manifest.plan_tensors
    assert any(e["dtype"] == "int8" for e in plan)
    for e in plan:
        if arch.role(e["name"]) in (Role.STATE_PROJ, Role.CONV, Role.DECAY, Role.MIX):
            assert e["dtype"] != "int8", e["name"]


def test_the_tokenizer_and_chat_template_are_copied(bundle, folder):
    tok = bundle.manifest.tokenizer
    assert tok.kind == "hf-json" and (bundle.path / tok.path).read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert tok.chat_template is not None and "<start_of_turn>" in (bundle.path / tok.chat_template).read_text()


def test_chat_reuses_the_state_and_rewinds_to_a_snapshot(bundle, folder):
    """Turn 2 feeds only the new turn and replies as a cold run over the whole transcript does
    (both past the window); another turn 2 rewinds to the turn-1 snapshot, rings included."""
    tokenizer = load_tokenizer(bundle.path / bundle.manifest.tokenizer.path)
    template = chat_template(Family("recurrent_gemma", "recurrent_gemma", "recurrent_gemma", None), folder / "tokenizer.json")
    assert assert_chat_reuses_and_rewinds(bundle.path, tokenizer, template) > 8
