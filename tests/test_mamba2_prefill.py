"""Mamba-2 chunked prefill: the `prefill` function against the one-token-at-a-time paths.

The prompt lengths and the shared checks are in tests/prefill_checks.py (T = 8). The
geometry has 2 groups and H != P != N; its K = 4 conv window spans chunk boundaries and
short chunks.
"""

from __future__ import annotations

import pytest
import torch

from mamba2_files import Geometry, write_transformers_folder
from prefill_checks import (
    CHUNK,
    LENGTHS,
    assert_coreai_prefill_equals_m1_loop,
    eager_modules,
    prompt,
    reference_run,
    run_prefill,
)
from ssmport.prefill import PREFILL_FUNCTION
from ssmport.loader.resolve import load_checkpoint


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_transformers_folder(tmp_path_factory.mktemp("m2p") / "mamba2-prefill", Geometry(), seed=5, tied=False)


@pytest.fixture(scope="module")
def model(folder):
    return load_checkpoint(folder)


@pytest.fixture(scope="module")
def bundle(folder, tmp_path_factory, export_fn):
    return export_fn(folder, tmp_path_factory.mktemp("m2pb"), quant="fp32", gate_steps=6, prefill_chunk=CHUNK)


@pytest.mark.parametrize("n", LENGTHS)
def test_prefill_module_matches_reference_loop(model, n):
    """torch eager prefill vs the plain per-head reference step: logits and both states."""
    _, module = eager_modules(model)
    tokens = prompt(n, model.config.vocab_size)
    got = run_prefill(module, tokens)

    want, state = reference_run(model, tokens)
    assert float((got - want).abs().max()) / float(want.abs().max()) < 1e-5
    for i in range(model.config.num_layers):
        assert torch.allclose(module.convState[i, 0].t(), state["conv"][i], atol=1e-5)
        assert torch.allclose(module.ssmState[i, 0], state["ssm"][i], atol=1e-5)


def test_padding_never_reaches_the_state(model):
    """Same real tokens, different padding ids: identical logits and states."""
    _, module = eager_modules(model)
    outs = []
    for pad in (0, 7):
        logits = run_prefill(module, [5, 9, 11], pad=pad)
        outs.append((logits.clone(), module.convState.clone(), module.ssmState.clone()))
    assert torch.count_nonzero(outs[0][1]) > 0  # the check below compares written states
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_prefill_then_decode_continues(model):
    """Decode picks up from the states prefill wrote (the modules share weights, not states)."""
    decode, module = eager_modules(model)
    tokens = prompt(CHUNK + 3, model.config.vocab_size)
    run_prefill(module, tokens)
    decode.convState.copy_(module.convState)
    decode.ssmState.copy_(module.ssmState)
    want, _ = reference_run(model, tokens + [3])
    with torch.no_grad():
        got = decode(torch.tensor([[3]], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32)).view(-1)
    assert float((got - want).abs().max()) / float(want.abs().max()) < 1e-5
    assert module.layers is decode.layers  # shared weights: the asset stores them once


@pytest.mark.parametrize("n", LENGTHS)
def test_coreai_prefill_equals_m1_loop(bundle, n):
    """On the Core AI runtime: prefill's last logits and states vs `main` fed one by one."""
    assert_coreai_prefill_equals_m1_loop(bundle.path, n)


def test_prefill_manifest(bundle):
    p = bundle.manifest.prefill
    assert p.function == PREFILL_FUNCTION and p.chunk == CHUNK
    assert bundle.manifest.gate.passed  # the gate fed half of each stream through prefill
