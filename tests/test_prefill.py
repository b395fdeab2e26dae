"""Chunked prefill (RWKV-7): the `prefill` function against the one-token-at-a-time paths.

The prompt lengths and the shared checks are in tests/prefill_checks.py.
"""

from __future__ import annotations

import pytest
import torch

from prefill_checks import (
    CHUNK,
    LENGTHS,
    assert_coreai_prefill_equals_m1_loop,
    eager_modules,
    padded_outputs_agree,
    prompt,
    reference_run,
    run_prefill,
)
from ssmport.prefill import PREFILL_INPUT_NAMES
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.runtime import Runner
from ssmport.loader.resolve import load_checkpoint

@pytest.fixture(scope="module")
def prefill_bundle(blinkdl_pth, bundles, export_fn):
    return export_fn(blinkdl_pth, bundles, quant="fp32", gate_steps=6, prefill_chunk=CHUNK, name="prefill-t8")


@pytest.mark.parametrize("n", LENGTHS)
def test_prefill_module_matches_reference_loop(blinkdl_pth, n):
    """torch eager prefill vs the plain reference step (BlinkDL layout), logits and states."""
    model = load_checkpoint(blinkdl_pth)
    module = eager_modules(model)[1]
    tokens = prompt(n, model.config.vocab_size)
    got = run_prefill(module, tokens)

    want, state = reference_run(model, tokens)
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) / scale < 1e-5
    for i in range(model.config.num_layers):
        assert torch.allclose(module.recState[i, 0], state["wkv"][i].transpose(1, 2), atol=1e-4)
        assert torch.allclose(module.shiftState[i, 0, 0], state["att_x"][i], atol=1e-5)
        assert torch.allclose(module.shiftState[i, 0, 1], state["ffn_x"][i], atol=1e-5)


def test_padding_never_reaches_the_state(blinkdl_pth):
    """Same real tokens, different padding ids: identical logits and states."""
    padded_outputs_agree(load_checkpoint(blinkdl_pth), [5, 9, 11])


@pytest.mark.parametrize("n", LENGTHS)
def test_coreai_prefill_equals_m1_loop(prefill_bundle, n):
    """On the Core AI runtime: prefill's last logits and states vs `main` fed one by one."""
    assert_coreai_prefill_equals_m1_loop(prefill_bundle.path, n)


def test_coreai_prefill_with_the_two_level_solve_equals_m1_loop(blinkdl_pth, bundles, export_fn):
    """A 32-token chunk takes ops.triangular's two-level solve (above BLOCK tokens), as the
    default 64-token chunk does: converted, run, and exact on the runtime, a partial chunk too."""
    from ssmport.ops.triangular import BLOCK

    chunk = 2 * BLOCK
    bundle = export_fn(blinkdl_pth, bundles, quant="fp32", gate_steps=4, prefill_chunk=chunk, name=f"prefill-t{chunk}")
    assert_coreai_prefill_equals_m1_loop(bundle.path, chunk + 13, chunk=chunk)


def test_prefill_manifest_and_runtime_signature(prefill_bundle, dims):
    m = prefill_bundle.manifest
    p = m.prefill
    assert p.function == "prefill" and p.chunk == CHUNK
    assert [(t.name, list(t.shape), t.dtype) for t in p.inputs] == [
        ("input_ids", [1, CHUNK], "int32"),
        ("position_ids", [1, CHUNK], "int32"),
        ("valid_len", [1], "int32"),
    ]
    assert [(t.name, list(t.shape)) for t in p.outputs] == [("logits", [1, 1, dims.vocab])]
    with Runner(prefill_bundle.path) as runner:
        d = runner._prefill.desc
        assert tuple(d.input_names) == PREFILL_INPUT_NAMES
        assert list(d.state_names) == [s.name for s in m.states]
    # the gate fed half of its stream through prefill
    assert m.gate.passed


def test_no_prefill_export_is_decode_only(blinkdl_pth, tmp_path, export_fn):
    result = export_fn(blinkdl_pth, tmp_path, quant="fp32", gate=False, prefill_chunk=None)
    assert result.manifest.prefill is None
    with Runner(result.path) as runner:
        assert not runner.has_prefill
        assert runner.feed([1, 2, 3]).shape == (runner.vocab_size,) and runner.tokens == [1, 2, 3]


def test_all_logits_rows_equal_decode_steps(blinkdl_pth):
    """`all_logits=True` returns every row's logits: the real rows equal decode, step by step."""
    from ssmport.graph import CausalLM

    model = load_checkpoint(blinkdl_pth)
    arch = model.architecture
    builder = WeightBuilder(get_recipe("fp32"), arch.keeps_float)
    with torch.no_grad():
        dec = arch.build_decode(model.config, model.weights, builder, torch.float32).eval()
        module = CausalLM(dec.embed, dec.layers, dec.head, dec.specs, chunk=CHUNK, all_logits=True).eval()
        tokens = prompt(5, model.config.vocab_size)
        ids = torch.zeros(1, CHUNK, dtype=torch.int32)
        ids[0, :5] = torch.tensor(tokens)
        rows = module(ids, torch.zeros(1, CHUNK, dtype=torch.int32), torch.tensor([5], dtype=torch.int32))[0]
        steps = torch.stack([dec(torch.tensor([[t]], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32))[0, 0] for t in tokens])
    assert rows.shape == (CHUNK, model.config.vocab_size)
    assert float((rows[:5] - steps).abs().max()) < 1e-4
