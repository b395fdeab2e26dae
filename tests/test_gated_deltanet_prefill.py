"""Gated DeltaNet chunked prefill: the prefill module against the reference loop (torch), and
the bundle's `prefill` function against its own M=1 loop on the Core AI runtime.

The tiny preset has grouped value heads (4 on 2 q/k heads) and dk 32 != dv 48, so a wrong
head mapping or a transposed state cannot pass; T = 8 and the lengths of tests/test_prefill.py
cover a padded chunk shorter than the conv window's history, exact chunks and a short tail.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gdn_files import GDNDims, write_gdn_folder
from ir_checks import graph_texts, writes_per_state
from ssmport.ops.delta_rule import chunk as delta_rule_chunk
from ssmport.ops.delta_rule import step as delta_rule_step
from ssmport.exporter.convert import convert
from ssmport.exporter.pipeline import export
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.loader.resolve import load_checkpoint, load_model
from prefill_checks import (
    CHUNK,
    LENGTHS,
    assert_coreai_prefill_equals_m1_loop,
    padded_outputs_agree,
    prefill_vs_reference,
)

TINY = "gated-deltanet-tiny"


@pytest.fixture(scope="module")
def tiny():
    return load_model(TINY)


@pytest.fixture(scope="module")
def tiny_prefill_bundle(tmp_path_factory):
    return export(TINY, tmp_path_factory.mktemp("gdn-prefill"), quant="fp32", gate_steps=6, progress=False,
                  prefill_chunk=CHUNK)  # fmt: skip


def _check_against_reference(model, n: int):
    module, state = prefill_vs_reference(model, n)
    for i in range(model.config.num_layers):
        conv = state["conv"][i]
        assert torch.allclose(module.convState[i, 0], torch.cat([conv["q"], conv["k"], conv["v"]], dim=1), atol=1e-5)
        assert torch.allclose(module.recState[i, 0], state["S"][i], atol=1e-5)


@pytest.mark.parametrize("n", LENGTHS)
def test_prefill_module_matches_reference_loop(tiny, n):
    """torch eager prefill vs the per-head reference step: last logits, convState, recState."""
    _check_against_reference(tiny, n)


def test_prefill_module_with_conv_bias_neg_eigval_no_gate(tmp_path):
    """The optional pieces (conv bias, beta in (0, 2), no output gate) through prefill too."""
    dims = GDNDims(allow_neg_eigval=True, tie=True, conv_bias=True, use_gate=False, v_heads=2, expand_v=2)
    model = load_checkpoint(write_gdn_folder(tmp_path / "gdn", dims, seed=3))
    _check_against_reference(model, 2 * CHUNK + 3)


def test_padding_never_reaches_the_state(tiny):
    padded_outputs_agree(tiny, [5, 9])


def test_prefill_shares_weights_and_writes_each_state_once(tiny):
    arch = tiny.architecture
    builder = WeightBuilder(get_recipe("fp32"), arch.keeps_float)
    with torch.no_grad():
        decode = arch.build_decode(tiny.config, tiny.weights, builder, torch.float32)
        module = arch.build_prefill(tiny.config, decode, CHUNK)
    assert {id(p) for p in module.parameters()} == {id(p) for p in decode.parameters()}
    program = convert(tiny, WeightBuilder(get_recipe("fp32"), arch.keeps_float), torch.float32, prefill_chunk=CHUNK).program
    assert writes_per_state(program, "prefill") == writes_per_state(program, "prefill", top_level_only=True)
    assert writes_per_state(program, "prefill") == {"convState": 1, "recState": 1}
    assert writes_per_state(program) == {"convState": 1, "recState": 1}
    # The delta rule runs in its chunkwise form: no in-graph loop in either function.
    assert not any("coreai.while" in text for text in graph_texts(program).values())


@pytest.mark.parametrize("T, valid, beta_max", [(64, 64, 1.0), (64, 37, 2.0), (5, 5, 2.0), (1, 1, 1.0)])
def test_chunkwise_form_equals_the_step_loop(T, valid, beta_max):
    """delta_rule_chunk (the WY form with its product-of-powers inverse) against T steps of
    delta_rule_step, in float64 so only the algebra is compared; beta up to 2 is
    allow_neg_eigval, the largest entries the inverse sees. Padding rows change nothing."""
    g = torch.Generator().manual_seed(T + valid)
    HV, dk, dv = 3, 16, 24
    q, k = (F.normalize(torch.randn(T, HV, dk, generator=g, dtype=torch.float64), dim=-1) for _ in range(2))
    v = torch.randn(T, HV, dv, generator=g, dtype=torch.float64)
    beta = torch.rand(T, HV, generator=g, dtype=torch.float64) * beta_max
    log_decay = -torch.rand(T, HV, generator=g, dtype=torch.float64)
    S0 = torch.randn(HV, dk, dv, generator=g, dtype=torch.float64)

    S_chunk, O_chunk = delta_rule_chunk(S0, q, k, v, beta, log_decay, torch.tensor([valid]))
    S = S0
    for t in range(valid):
        S, o = delta_rule_step(S, q[t], k[t], v[t], beta[t].view(HV, 1, 1), torch.exp(log_decay[t]).view(HV, 1, 1))
        torch.testing.assert_close(O_chunk[t], o, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(S_chunk, S, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("n", LENGTHS)
def test_coreai_prefill_equals_m1_loop(tiny_prefill_bundle, n):
    """Last logits, convState and recState vs the M=1 loop; then three decode steps."""
    assert_coreai_prefill_equals_m1_loop(tiny_prefill_bundle.path, n, then=(3, 400, 17))
