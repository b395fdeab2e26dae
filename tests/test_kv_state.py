"""A positional ("kv") state end to end, on the test-only hybrid tests/kvtoy.py.

Decode writes each token's K/V at its position, prefill writes a chunk's rows, each state is
written once per function (read from the IR independently of ssmport.exporter.contract), the Core AI
bundle matches the plain reference loop and its own M=1 loop, a snapshot of the KV rows plus
the length restores exactly, and feeding past the context is one clear error. The toy is not
registered: it is exported as a LoadedModel, so this process's registry is untouched.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ir_checks import writes_per_state
from kvtoy import KVTOY, KVToyConfig
from prefill_checks import CHUNK, LENGTHS, assert_coreai_prefill_equals_m1_loop, assert_snapshot_restores, prompt

from ssmport.architectures import LoadedModel
from ssmport.errors import SsmportError
from ssmport.exporter.convert import convert
from ssmport.exporter.pipeline import export
from ssmport.graph import CausalLM
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.runtime import Runner

CFG = KVToyConfig()


def toy_model() -> LoadedModel:
    return LoadedModel(KVTOY, CFG, KVTOY.synthetic_weights(CFG, 0), {"kind": "synthetic", "preset": "kvtoy-tiny", "seed": 0},
                       name="kvtoy-tiny")  # fmt: skip


def reference_run(tokens):
    ref = KVTOY.reference(CFG, toy_model().weights)
    state = ref.zero_state()
    logits = [ref.step(t, state) for t in tokens]
    return torch.stack(logits), state


@pytest.fixture(scope="module")
def modules():
    model = toy_model()
    builder = WeightBuilder(get_recipe("fp32"), KVTOY.keeps_float)
    with torch.no_grad():
        decode = KVTOY.build_decode(CFG, model.weights, builder, torch.float32).eval()
        return decode, KVTOY.build_prefill(CFG, decode, CHUNK).eval()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("kv")
    return export(toy_model(), out, quant="fp32", gate=False, progress=False, prefill_chunk=CHUNK).path


def test_state_kinds_and_stacks(modules):
    decode, _ = modules
    assert [(s.name, s.kind, s.shape) for s in decode.specs] == [
        ("keyCache", "kv", (2, 1, CFG.kv_heads, CFG.context, CFG.head_dim)),
        ("valueCache", "kv", (2, 1, CFG.kv_heads, CFG.context, CFG.head_dim)),
        ("h", "fixed", (1, 1, CFG.width)),
    ]
    assert decode.slots == [{"keyCache": 0, "valueCache": 0}, {"h": 0}, {"keyCache": 1, "valueCache": 1}]


def test_decode_writes_each_token_at_its_position(modules):
    decode, _ = modules
    tokens = prompt(13, CFG.vocab_size)
    for b in decode.buffers():
        b.zero_()
    with torch.no_grad():
        got = torch.stack([decode(torch.tensor([[t]], dtype=torch.int32), torch.tensor([[p]], dtype=torch.int32)).view(-1)
                           for p, t in enumerate(tokens)])  # fmt: skip
    want, state = reference_run(tokens)
    assert float((got - want).abs().max()) / float(want.abs().max()) < 1e-5
    for slot, layer in enumerate((0, 2)):  # the cache rows are the reference's K / V, position by position
        assert torch.allclose(decode.keyCache[slot, 0, :, :13].transpose(0, 1), torch.stack(state["K"][layer]), atol=1e-5)
        assert torch.allclose(decode.valueCache[slot, 0, :, :13].transpose(0, 1), torch.stack(state["V"][layer]), atol=1e-5)
    assert not decode.keyCache[:, :, :, 13:].any()  # nothing written past the last position


@pytest.mark.parametrize("n", LENGTHS)
def test_prefill_writes_a_chunk(modules, n):
    _, prefill = modules
    tokens = prompt(n, CFG.vocab_size)
    for b in prefill.buffers():
        b.zero_()
    with torch.no_grad():
        for start in range(0, n, CHUNK):
            chunk = tokens[start : start + CHUNK]
            ids = torch.zeros(1, CHUNK, dtype=torch.int32)
            ids[0, : len(chunk)] = torch.tensor(chunk)
            positions = torch.arange(start, start + CHUNK, dtype=torch.int32).view(1, CHUNK)
            logits = prefill(ids, positions, torch.tensor([len(chunk)], dtype=torch.int32)).view(-1)
    want, state = reference_run(tokens)
    assert float((logits - want[-1]).abs().max()) / float(want.abs().max()) < 1e-5
    assert torch.allclose(prefill.keyCache[1, 0, :, :n].transpose(0, 1), torch.stack(state["K"][2]), atol=1e-5)
    assert torch.allclose(prefill.h.view(-1), state["h"], atol=1e-6)
    assert not prefill.valueCache[:, :, :, n:].any()  # padding rows never land past the last real token


def test_one_write_per_state_in_each_function():
    program = convert(toy_model(), WeightBuilder(get_recipe("fp32"), KVTOY.keeps_float), torch.float32,
                      prefill_chunk=CHUNK).program  # fmt: skip
    for function in ("main", "prefill"):
        assert writes_per_state(program, function, top_level_only=True) == {"keyCache": 1, "valueCache": 1, "h": 1}


def test_bundle_records_the_kinds(bundle):
    from ssmport.bundle import Bundle

    m = Bundle.open(bundle).manifest
    assert [(s.name, s.kind) for s in m.states] == [("keyCache", "kv"), ("valueCache", "kv"), ("h", "fixed")]
    with Runner(bundle) as runner:
        assert runner.context == CFG.context


def test_coreai_matches_the_reference(bundle):
    tokens = prompt(21, CFG.vocab_size)
    want, state = reference_run(tokens)
    with Runner(bundle, prefill=False) as runner:
        got = runner.step_each(tokens)
        keys = runner.state("keyCache")
    assert np.abs(got - want.numpy()).max() / np.abs(want.numpy()).max() < 1e-5
    np.testing.assert_allclose(keys[0, 0, :, :21].transpose(1, 0, 2), torch.stack(state["K"][0]).numpy(), atol=1e-5)


@pytest.mark.parametrize("n", LENGTHS)
def test_coreai_prefill_equals_the_m1_loop(bundle, n):
    assert_coreai_prefill_equals_m1_loop(bundle, n)


def test_snapshot_of_kv_rows_restores_exactly(bundle, tmp_path):
    snap = assert_snapshot_restores(bundle, prompt(11, CFG.vocab_size), prompt(6, CFG.vocab_size, seed=5),
                                    prompt(20, CFG.vocab_size, seed=9), tmp_path / "kv.safetensors")  # fmt: skip
    assert snap.states["keyCache"].shape == (2, 1, CFG.kv_heads, 11, CFG.head_dim)  # rows up to the length only


def test_feeding_past_the_context_is_refused(bundle):
    with Runner(bundle) as runner:
        runner.feed(prompt(CFG.context - 1, CFG.vocab_size))
        runner.step(1)
        with pytest.raises(SsmportError, match=f"context is full: {CFG.context} tokens held"):
            runner.step(2)
        assert len(runner.tokens) == CFG.context
        runner.reset()
        with pytest.raises(SsmportError, match="context is full"):
            runner.feed(prompt(CFG.context + 1, CFG.vocab_size))
        assert runner.tokens == []


def test_graph_rejects_blocks_that_do_not_fit_the_stacks(modules):
    decode, _ = modules
    with pytest.raises(ValueError, match="stacks 2 layers but 1 use it"):
        CausalLM(decode.embed, list(decode.layers)[:2], decode.head, decode.specs)
