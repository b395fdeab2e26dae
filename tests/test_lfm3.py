"""LFM3 against transformers' `Lfm3ForCausalLM` (pure-torch path) on the tiny non-square fixture of
tests/lfm3_files.py: window 8, streams five windows long, so the sliding layers' rings wrap.

The fp32 bundle on the Core AI runtime is transformers' within 2e-3 with every top-1 equal;
prefill equals the M=1 loop at prompt lengths around the window and the chunk (12); a
snapshot restores exactly across a wrap; only the full-attention KV grows with --context;
int8keepproj passes its gate (int4keepproj does not on this random-weight fixture: an xfail
with the measurement); the options (sandwich norms, gate, biases,
tying, RoPE types) each follow transformers; refusals are one line.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hybrid_checks import (assert_config_refused, CORE_AI_ATOL, Family, assert_chat_reuses_and_rewinds, assert_close_to, chat_template, eager_logits,
                           rewrite, tensors_of)  # fmt: skip
from lfm3_files import Lfm3Dims, transformers_logits, write_lfm3
from prefill_checks import assert_coreai_prefill_equals_m1_loop, assert_snapshot_restores, prompt

from ssmport.architectures import get_architecture, presets
from ssmport.errors import CheckpointError
from ssmport.exporter.pipeline import export
from ssmport.quant.roles import Role
from ssmport.tokenizers import load_tokenizer
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_checkpoint

D = Lfm3Dims()
W, CHUNK = D.window, 12
STREAM = prompt(5 * W, D.vocab, seed=11)
STATES = ["keyCache", "valueCache", "slidingKeyCache", "slidingValueCache", "convStates"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_lfm3(tmp_path_factory.mktemp("lfm3") / "lfm3", D, seed=7)


@pytest.fixture(scope="module")
def theirs(folder):
    return transformers_logits(folder, STREAM).numpy()


@pytest.fixture(scope="module")
def bundle(folder, tmp_path_factory):
    return export(str(folder), tmp_path_factory.mktemp("fp32"), quant="fp32", gate_steps=6, prefill_chunk=CHUNK,
                  context=64, progress=False)  # fmt: skip


@pytest.fixture(scope="module")
def int8_bundle(folder, tmp_path_factory):
    """int8keepproj at --context 4096 (the fp32 bundle's is 64)."""
    return export(str(folder), tmp_path_factory.mktemp("int8"), quant="int8keepproj", gate_steps=6, prefill_chunk=None,
                  context=4096, progress=False)  # fmt: skip


def test_fp32_bundle_matches_transformers(bundle, theirs):
    assert bundle.manifest.gate.passed
    with Runner(bundle.path, prefill=False) as runner:
        assert runner.state_names == STATES
        ours = runner.step_each(STREAM)
    assert np.abs(ours - theirs).max() <= CORE_AI_ATOL
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_the_reference_loop_matches_transformers(folder, theirs):
    model = load_checkpoint(folder)
    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    with torch.no_grad():
        assert_close_to(np.stack([ref.step(t, state).numpy() for t in STREAM]), theirs)


@pytest.mark.parametrize("n", (1, W - 1, W, W + 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5))
def test_prefill_equals_the_m1_loop(bundle, n):
    assert_coreai_prefill_equals_m1_loop(bundle.path, n, chunk=CHUNK)


def test_snapshot_across_a_wrap_restores_exactly(bundle, tmp_path):
    snap = assert_snapshot_restores(bundle.path, prompt(2 * W + 3, D.vocab), prompt(W + 2, D.vocab, seed=5),
                                    prompt(9, D.vocab, seed=9), tmp_path / "lfm3.safetensors")  # fmt: skip
    assert snap.states["slidingKeyCache"].shape == (2, 1, D.kv_heads, W, D.head_dim)  # the whole ring
    assert snap.states["keyCache"].shape == (1, 1, D.kv_heads, 2 * W + 3, D.head_dim)  # rows up to the length


def test_chat_reuses_the_state_and_equals_a_cold_run(bundle, folder):
    """Turn 2 feeds only its own tokens (the rings, KV rows and conv windows of turn 1 reused),
    its reply equals a cold run, and another turn 2 rewinds to the turn-1 snapshot."""
    tokenizer = load_tokenizer(bundle.path / bundle.manifest.tokenizer.path)
    template = chat_template(Family("lfm3", "lfm3", "lfm3", write_lfm3), folder / "tokenizer.json")
    assert_chat_reuses_and_rewinds(bundle.path, tokenizer, template)


def test_only_the_full_attention_kv_grows_with_the_context(bundle, int8_bundle):
    small, large = ({s.name: s for s in b.manifest.states} for b in (bundle, int8_bundle))
    for name in ("slidingKeyCache", "slidingValueCache"):
        assert small[name].kind == large[name].kind == "ring"
        # the slot axis grows with the tokens up to the window, whatever the context (ssmport.growing_kv)
        assert small[name].full_shape == large[name].full_shape == (2, 1, D.kv_heads, W, D.head_dim)
        assert small[name].window == large[name].window == W and small[name].context is None
    for name in ("keyCache", "valueCache"):
        assert (small[name].context, large[name].context) == (64, 4096)
    assert bundle.manifest.fixed_state_bytes == int8_bundle.manifest.fixed_state_bytes


def test_int8keepproj_passes_its_gate(int8_bundle, folder):
    assert int8_bundle.manifest.gate.passed, int8_bundle.gate_headline
    arch = load_checkpoint(folder).architecture
    plan = int8_bundle.manifest.plan_tensors
    assert any(e["dtype"] == "int8" for e in plan)
    for e in plan:
        if arch.role(e["name"]) in (Role.STATE_PROJ, Role.CONV):
            assert e["dtype"] != "int8", e["name"]


INT4_MEASURED = ("int4keepproj misses its gate on this random-weight fixture: top-1 3/6 (+2 near-ties), 0.339 of "
                 "logit scale 3.68 (limit 0.3), 13/16 over 16 steps; without the sandwich norms 10/16 (+3 near-ties) "
                 "at 0.251; with the FFN at int8 12/16 at 0.198. The fixture's logits are near-flat (qwen3.5-tiny "
                 "fails the same way, quant/recipes.py); no trained LFM3 weights here to measure. Not a bug: w2 alone at "
                 "int4 0.322, o_proj 0.130, both at int8 0.013 (docs/quantization.md, benchmarks/int4_ablation.py)")


@pytest.mark.xfail(strict=True, reason=INT4_MEASURED)
def test_int4keepproj_passes_its_gate(folder, tmp_path):
    result = export(str(folder), tmp_path, quant="int4keepproj", gate_steps=6, prefill_chunk=None, context=64,
                    progress=False)  # fmt: skip
    assert any(e["dtype"] == "int4" for e in result.manifest.plan_tensors)
    assert result.manifest.gate.passed, result.gate_headline


@pytest.mark.parametrize("dims", [
    replace(D, sandwich=False, gate=False),
    replace(D, attention_bias=True, conv_bias=True, tied=False),
    replace(D, rope={"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                     "sliding_attention": {"rope_type": "proportional", "rope_theta": 1e4, "partial_rotary_factor": 0.25}}),
], ids=["no-sandwich-no-gate", "biases-untied", "rope-types-swapped"])  # fmt: skip
def test_options_follow_transformers(dims, tmp_path):
    folder = write_lfm3(tmp_path / "variant", dims, seed=8)
    model = load_checkpoint(folder)
    assert_close_to(eager_logits(model, STREAM[: 2 * W + 3]), transformers_logits(folder, STREAM[: 2 * W + 3]))


def test_tokenizer_and_chat_template_are_carried(bundle, folder):
    tok = bundle.manifest.tokenizer
    copied = bundle.path / tok.path
    assert tok.kind == "hf-json" and copied.read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert tok.sha256 == hashlib.sha256(copied.read_bytes()).hexdigest()
    assert tok.chat_template is not None and "<|im_start|>" in (bundle.path / tok.chat_template).read_text()


def test_strict_loading_names_every_missing_and_unexpected_tensor(folder, tmp_path):
    tensors = tensors_of(folder)
    dropped = ["model.layers.1.self_attn.gate_proj.weight", "model.layers.5.post_ffn_norm.weight"]
    extra = {"model.layers.2.self_attn.g_proj.weight": torch.zeros(D.heads, D.hidden)}
    broken = rewrite(folder, tmp_path / "broken", {k: v for k, v in tensors.items() if k not in dropped} | extra)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(broken)
    assert "\n" not in str(info.value) and all(n in str(info.value) for n in [*dropped, *extra])


@pytest.mark.parametrize("edit, says", [
    (lambda c: c["rope_parameters"]["full_attention"].update(rope_type="yarn", factor=4.0), "rope_type 'yarn'"),
    (lambda c: c["rope_parameters"]["full_attention"].update(factor=2.0), "a rope factor 2.0"),
    (lambda c: c.update(sliding_window=None), "sliding_window=null"),
    (lambda c: c.update(layer_types=["conv", "linear_attention", "full_attention", "conv", "conv", "conv"]),
     "'linear_attention'"),
    (lambda c: c.update(num_hidden_layers=5), "6 layer_types for num_hidden_layers=5"),
])  # fmt: skip
def test_unsupported_configs_are_refused_in_one_line(folder, tmp_path, edit, says):
    assert_config_refused(folder, tmp_path / "bad", edit, says)


def test_the_preset_has_transformers_default_size():
    """lfm3-1.7b's parameters (the tied head once) = transformers' Lfm3ForCausalLM built from
    its default Lfm3Config (which it documents as LFM3-1.7B-style), on the meta device."""
    from transformers import Lfm3Config, Lfm3ForCausalLM

    arch = get_architecture("lfm3")
    config = arch.config_from_json(dict(presets()["lfm3-1.7b"].config))
    ours = sum(math.prod(s) for n, s in arch.canonical_shapes(config).items() if n != "lm_head.weight")
    with torch.device("meta"):
        theirs = sum(p.numel() for p in Lfm3ForCausalLM(Lfm3Config()).parameters())
    assert ours == theirs
    assert config.layer_types == tuple(Lfm3Config().layer_types) and config.sliding_window == Lfm3Config().sliding_window


# -- --layout apple: the rings as Apple's sliding cache (docs/apple-engines.md, section 8) ------------

FP16_ROUNDING = 2.0**-11  # the apple layout's logits are fp16: round to nearest, half an ulp of each logit
APPLE_STATES = ["keyCache", "valueCache", "slidingCache", "convStates"]


@pytest.fixture(scope="module")
def apple_bundle(folder, tmp_path_factory):
    return export(str(folder), tmp_path_factory.mktemp("apple"), quant="fp32", gate_steps=6, context=64, layout="apple",
                  progress=False)  # fmt: skip


def test_apple_bundle_matches_transformers_and_the_default_bundle(apple_bundle, bundle, theirs):
    """Four states, the two rings as one `slidingCache` (Apple's engines take 2-4); logits within
    the default bundle's bounds plus the fp16 rounding of Apple's logits."""
    import json

    m = apple_bundle.manifest
    assert m.gate.passed and [s.name for s in m.states] == APPLE_STATES
    assert m.states[2].kind == "ring" and m.states[2].shape == (4, 1, D.kv_heads, W, D.head_dim)
    meta = json.loads((apple_bundle.path / "metadata.json").read_text())["language"]["states"]
    assert meta == {"keyCache": "kv_cache", "valueCache": "kv_cache", "slidingCache": "sliding_cache", "convStates": "fixed"}
    with Runner(apple_bundle.path, prefill=False) as runner:
        ours = runner.step_each(STREAM)
    with Runner(bundle.path, prefill=False) as runner:
        default = runner.step_each(STREAM)
    assert (np.abs(ours - theirs) <= CORE_AI_ATOL + np.abs(theirs) * FP16_ROUNDING).all()
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
    assert (np.abs(ours - default) <= 1e-4 + np.abs(default) * FP16_ROUNDING).all()


@pytest.mark.parametrize("rows, n", [(5, W + 1), (5, 3 * W + 2), (CHUNK, W), (CHUNK, CHUNK + 1), (CHUNK, 3 * CHUNK + 5)])
def test_apple_prefill_equals_the_m1_loop(apple_bundle, rows, n):
    """Prefill calls shorter and longer than the window (a call wraps the rings)."""
    assert_coreai_prefill_equals_m1_loop(apple_bundle.path, n, chunk=64, rows=rows)


def test_apple_snapshot_across_a_wrap_restores_exactly(apple_bundle, tmp_path):
    snap = assert_snapshot_restores(apple_bundle.path, prompt(2 * W + 3, D.vocab), prompt(W + 2, D.vocab, seed=5),
                                    prompt(9, D.vocab, seed=9), tmp_path / "lfm3-apple.safetensors")  # fmt: skip
    assert snap.states["slidingCache"].shape == (4, 1, D.kv_heads, W, D.head_dim)


def test_check_engine_says_which_engines_drive_the_apple_bundle(apple_bundle, capsys):
    """At the prefill-graph revision both dynamic engines drive it (kv, kv, sliding, fixed: the
    fixed conv state makes every rewind a full reset, which keeps the ring exact)."""
    from ssmport.cli.main import main

    assert main(["check-engine", str(apple_bundle.path)]) == 0
    out = capsys.readouterr().out
    assert "coreai-pipelined @prefill-graph  drives  (default engine)" in out
    assert "coreai-sequential @prefill-graph  drives" in out
    assert "ring_rewind" not in out
