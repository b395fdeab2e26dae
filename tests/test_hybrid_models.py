"""LFM2, Granite-4.0-H and Nemotron-H bundles against transformers' own classes, on the tiny
non-square fixtures of tests/hybrid_files.py (transformers' pure-torch paths only).

For each family, one fp32 bundle (with a prefill function) is exported per module: on the
Core AI runtime its logits are transformers' within 2e-3 with every top-1 equal, its four
(LFM2: three) stacked states equal transformers' cache, prefill equals the M=1 loop, and
chat reuses snapshots. int8keepproj passes its gate; strict loading names every missing and
unexpected tensor in one line. Family-specific features (multipliers, "nope", patterns, the
dt clamp, refusals) are in test_lfm2.py, test_granite_hybrid.py and test_nemotron_h.py."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from hybrid_checks import (CORE_AI_ATOL, FAMILIES, TOKENS, assert_chat_reuses_and_rewinds, assert_close_to, chat_template,
                           rewrite, tensors_of)  # fmt: skip
from ir_checks import writes_per_state
from prefill_checks import CHUNK, LENGTHS, assert_coreai_prefill_equals_m1_loop

import hybrid_files as hf
from ssmport.errors import CheckpointError
from ssmport.exporter.convert import convert
from ssmport.exporter.pipeline import export
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.quant.roles import Role
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_checkpoint
from ssmport.tokenizers import load_tokenizer

STATES = {"lfm2": ["keyCache", "valueCache", "convStates"]}
FOUR = ["keyCache", "valueCache", "convStates", "recurrentStates"]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    return FAMILIES[request.param]


@pytest.fixture(scope="module")
def folder(family, tmp_path_factory):
    return family.write(tmp_path_factory.mktemp(family.name) / family.name)


@pytest.fixture(scope="module")
def reference(folder):
    return hf.reference_run(folder, TOKENS)


@pytest.fixture(scope="module")
def bundle(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("bundles")
    return export(str(folder), out, quant="fp32", gate_steps=6, prefill_chunk=CHUNK, progress=False)


def test_fp32_bundle_matches_transformers(bundle, reference, family):
    assert bundle.manifest.gate.passed
    with Runner(bundle.path, prefill=False) as runner:
        assert runner.state_names == STATES.get(family.name, FOUR)
        ours = runner.step_each(TOKENS)
    theirs = reference.step_logits.numpy()
    assert np.abs(ours - theirs).max() <= CORE_AI_ATOL
    assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_the_reference_loop_matches_transformers(folder, reference):
    """ssmport's plain reference (the spec the export form is held to by the contract)
    against an independent implementation."""
    model = load_checkpoint(folder)
    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    with torch.no_grad():
        ours = np.stack([ref.step(t, state).numpy() for t in TOKENS])
    assert_close_to(ours, reference.step_logits)


@pytest.mark.parametrize("prefill", [False, True])
def test_states_equal_transformers_cache(bundle, reference, prefill):
    """Every stacked state after the tokens equals transformers' cache in Apple's layout
    (hybrid_files.stacked_states: KV zero past the length, conv time-major), through the
    M=1 loop and through chunked prefill."""
    with Runner(bundle.path, prefill=prefill) as runner:
        runner.feed(TOKENS)
        want = hf.stacked_states(reference.cache, runner.context)
        assert sorted(want) == sorted(runner.state_names)
        for name in runner.state_names:
            got, expected = runner.state(name), want[name].numpy()
            assert got.shape == expected.shape, name
            assert np.abs(got - expected).max() <= 1e-4 * max(1.0, np.abs(expected).max()), name


@pytest.mark.parametrize("n", LENGTHS)
def test_prefill_equals_the_m1_loop(bundle, n):
    assert_coreai_prefill_equals_m1_loop(bundle.path, n)


def test_each_state_is_written_once_per_function(tmp_path):
    """Read from the IR independently of ssmport.exporter.contract (which checks it at every export),
    on Nemotron-H: all four states and a stateless layer (a conversion takes ~10 s)."""
    model = load_checkpoint(FAMILIES["nemotron-h"].write(tmp_path / "nemotron-h"))
    program = convert(model, WeightBuilder(get_recipe("fp32"), model.architecture.keeps_float), torch.float32,
                      prefill_chunk=4).program  # fmt: skip
    names = [s.name for s in model.architecture.state_specs(model.config, torch.float32)]
    for function in ("main", "prefill"):
        assert writes_per_state(program, function, top_level_only=True) == dict.fromkeys(names, 1)


def test_int8keepproj_passes_its_gate_and_keeps_the_recurrence_inputs_float(folder, tmp_path):
    result = export(str(folder), tmp_path, quant="int8keepproj", gate_steps=6, prefill_chunk=None, progress=False)
    assert result.manifest.gate.passed, result.gate_headline
    arch = load_checkpoint(folder).architecture
    plan = result.manifest.plan_tensors
    assert any(e["dtype"] == "int8" for e in plan), "nothing went int8: the fixture's widths must allow 32-blocks"
    for e in plan:
        if arch.role(e["name"]) in (Role.STATE_PROJ, Role.CONV, Role.SSM):
            assert e["dtype"] != "int8", e["name"]


def test_strict_loading_names_every_missing_and_unexpected_tensor(folder, tmp_path):
    tensors = tensors_of(folder)
    layer_names = sorted(n for n in tensors if ".layers." in n)
    dropped = [layer_names[0], layer_names[-1]]
    extra = {"model.layers.0.surprise.weight": torch.zeros(2), "mtp.fc.weight": torch.zeros(2, 2)}
    broken = rewrite(folder, tmp_path / "broken", {k: v for k, v in tensors.items() if k not in dropped} | extra)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(broken)
    message = str(info.value)
    assert "\n" not in message
    for name in [*dropped, *extra]:
        assert name in message


def test_tokenizer_json_is_copied(bundle, folder):
    tok = bundle.manifest.tokenizer
    copied = bundle.path / tok.path
    assert tok.kind == "hf-json" and copied.read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert tok.sha256 == hashlib.sha256(copied.read_bytes()).hexdigest()


def test_chat_reuses_the_state_and_equals_a_cold_run(bundle, folder, family):
    """Turn 2 feeds only the new turn (the KV rows and the recurrent states of turn 1 are
    reused) and its reply equals a cold run over the whole transcript; a different turn 2
    rewinds to the turn-1 snapshot."""
    tokenizer = load_tokenizer(bundle.path / bundle.manifest.tokenizer.path)
    assert_chat_reuses_and_rewinds(bundle.path, tokenizer, chat_template(family, folder / "tokenizer.json"))


def test_context_sizes_the_kv_cache_within_what_the_model_was_trained_for(folder, tmp_path):
    from ssmport.errors import SsmportError
    from ssmport.loader.resolve import with_context

    model = load_checkpoint(folder)
    trained = model.config.max_position_embeddings
    assert model.config.context == min(4096, trained)  # the default: 4096, or fewer when trained on fewer
    shorter = with_context(model, 16)
    kv = {s.name: s.shape for s in shorter.architecture.state_specs(shorter.config, torch.float32) if s.kind == "kv"}
    assert kv and all(shape[3] == 16 for shape in kv.values())
    with pytest.raises(SsmportError, match="beyond the model's max_position_embeddings"):
        with_context(model, trained + 1)
    with pytest.raises(SsmportError, match="whole number of positions"):
        export(str(folder), tmp_path, context=0, progress=False)
    assert not any(tmp_path.iterdir())
