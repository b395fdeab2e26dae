"""Chunked prefill: the `prefill` function against the one-token-at-a-time paths.

Prompt lengths 1, T-1, T, T+1 and 3T+5 cover a single padded chunk, an exact chunk, a
chunk plus one, and several chunks with a short tail (T = 8 keeps the tests fast).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ssmport.prefill import PREFILL_INPUT_NAMES
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.runtime import Runner
from ssmport.sources import load_checkpoint

CHUNK = 8
LENGTHS = (1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5)


def prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed + n).integers(0, vocab, size=n).tolist()


@pytest.fixture(scope="module")
def prefill_bundle(blinkdl_pth, bundles, export_fn):
    return export_fn(blinkdl_pth, bundles, quant="fp32", gate_steps=6, prefill_chunk=CHUNK, name="prefill-t8")


def _eager_prefill(model):
    arch = model.architecture
    builder = WeightBuilder(get_recipe("fp32"), arch.keeps_float)
    with torch.no_grad():
        decode = arch.build_decode(model.config, model.weights, builder, torch.float32).eval()
        return arch.build_prefill(model.config, decode, CHUNK).eval()


def _run_prefill(module, tokens):
    for name, _ in module.named_buffers():
        getattr(module, name).zero_()
    with torch.no_grad():
        for start in range(0, len(tokens), CHUNK):
            chunk = tokens[start : start + CHUNK]
            ids = torch.zeros(1, CHUNK, dtype=torch.int32)
            ids[0, : len(chunk)] = torch.tensor(chunk)
            logits = module(ids, torch.zeros(1, CHUNK, dtype=torch.int32), torch.tensor([len(chunk)], dtype=torch.int32))
    return logits.view(-1)


def prefill_vs_reference(model, n: int):
    """Prefill module and reference loop on the same n-token prompt: (module, got logits,
    reference logits, reference state), with the logits already checked (rel < 1e-5)."""
    module = _eager_prefill(model)
    tokens = prompt(n, model.config.vocab_size)
    got = _run_prefill(module, tokens)

    ref = model.architecture.reference(model.config, model.weights)
    state = ref.zero_state()
    for t in tokens:
        want = ref.step(t, state)
    assert float((got - want).abs().max()) / float(want.abs().max()) < 1e-5
    return module, state


def padded_outputs_agree(model, real: list[int]) -> None:
    """Same real tokens, padding ids 0 and 7: identical logits and states."""
    module = _eager_prefill(model)
    outs = []
    for pad in (0, 7):
        for name, _ in module.named_buffers():
            getattr(module, name).zero_()
        ids = torch.tensor([real + [pad] * (CHUNK - len(real))], dtype=torch.int32)
        with torch.no_grad():
            logits = module(ids, torch.zeros(1, CHUNK, dtype=torch.int32), torch.tensor([len(real)], dtype=torch.int32))
        outs.append([logits.clone(), *(b.clone() for b in module.buffers())])
    for a, b in zip(*outs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("n", LENGTHS)
def test_prefill_module_matches_reference_loop(blinkdl_pth, n):
    """torch eager prefill vs the plain reference step (BlinkDL layout), logits and states."""
    model = load_checkpoint(blinkdl_pth)
    module, state = prefill_vs_reference(model, n)
    for i in range(model.config.num_layers):
        assert torch.allclose(module.recState[i, 0], state["wkv"][i].transpose(1, 2), atol=1e-4)
        assert torch.allclose(module.shiftState[i, 0, 0], state["att_x"][i], atol=1e-5)
        assert torch.allclose(module.shiftState[i, 0, 1], state["ffn_x"][i], atol=1e-5)


def test_padding_never_reaches_the_state(blinkdl_pth):
    """Same real tokens, different padding ids: identical logits and states."""
    padded_outputs_agree(load_checkpoint(blinkdl_pth), [5, 9, 11])


def prefill_matches_m1_loop(bundle, n: int, then: tuple[int, ...] = (3,)) -> None:
    """On the Core AI runtime: prefill's last logits and every state vs `main` fed one by
    one (max |Δ| <= 1e-4); then decoding `then` continues from the state prefill left."""
    with Runner(bundle) as fast, Runner(bundle, prefill=False) as slow:
        assert fast.has_prefill and fast.prefill_chunk == CHUNK and not slow.has_prefill
        tokens = prompt(n, fast.vocab_size)
        got, want = fast.feed(tokens), slow.feed(tokens)
        assert got.shape == want.shape == (fast.vocab_size,)
        assert np.abs(got - want).max() <= 1e-4
        for name in fast.state_names:
            assert np.abs(fast.state(name) - slow.state(name)).max() <= 1e-4
        assert fast.tokens == slow.tokens == tokens
        for t in then:
            assert np.abs(fast.step(t) - slow.step(t)).max() <= 1e-4


@pytest.mark.parametrize("n", LENGTHS)
def test_coreai_prefill_equals_m1_loop(prefill_bundle, n):
    prefill_matches_m1_loop(prefill_bundle.path, n)


def test_prefill_manifest_and_runtime_signature(prefill_bundle, dims):
    m = prefill_bundle.manifest
    p = m["prefill"]
    assert p["function"] == "prefill" and p["chunk"] == CHUNK
    assert [(t["name"], t["shape"], t["dtype"]) for t in p["inputs"]] == [
        ("input_ids", [1, CHUNK], "int32"),
        ("position_ids", [1, CHUNK], "int32"),
        ("valid_len", [1], "int32"),
    ]
    assert [(t["name"], t["shape"]) for t in p["outputs"]] == [("logits", [1, 1, dims.vocab])]
    with Runner(prefill_bundle.path) as runner:
        d = runner._prefill.desc
        assert tuple(d.input_names) == PREFILL_INPUT_NAMES
        assert list(d.state_names) == [s["name"] for s in m["states"]]
    # the gate fed half of its stream through prefill
    assert m["gate"]["passed"]


def test_no_prefill_export_is_decode_only(blinkdl_pth, tmp_path, export_fn):
    result = export_fn(blinkdl_pth, tmp_path, quant="fp32", gate=False, prefill_chunk=None)
    assert result.manifest["prefill"] is None
    with Runner(result.path) as runner:
        assert not runner.has_prefill
        assert runner.feed([1, 2, 3]).shape == (runner.vocab_size,) and runner.tokens == [1, 2, 3]


def test_all_logits_rows_equal_decode_steps(blinkdl_pth):
    """`all_logits=True` returns every row's logits: the real rows equal decode, step by step."""
    from ssmport.architectures.rwkv7 import RWKV7Prefill

    model = load_checkpoint(blinkdl_pth)
    arch = model.architecture
    builder = WeightBuilder(get_recipe("fp32"), arch.keeps_float)
    with torch.no_grad():
        dec = arch.build_decode(model.config, model.weights, builder, torch.float32).eval()
        module = RWKV7Prefill(dec, CHUNK, all_logits=True).eval()
        tokens = prompt(5, model.config.vocab_size)
        ids = torch.zeros(1, CHUNK, dtype=torch.int32)
        ids[0, :5] = torch.tensor(tokens)
        rows = module(ids, torch.zeros(1, CHUNK, dtype=torch.int32), torch.tensor([5], dtype=torch.int32))[0]
        steps = torch.stack([dec(torch.tensor([[t]], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32))[0, 0] for t in tokens])
    assert rows.shape == (CHUNK, model.config.vocab_size)
    assert float((rows[:5] - steps).abs().max()) < 1e-4
