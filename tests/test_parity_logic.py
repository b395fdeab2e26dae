"""The gate's verdicts, on hand-made logits (no model needed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ssmport.exporter.contract import GraphSignature, check_contract
from ssmport.manifest import TensorEntry
from ssmport.errors import SsmportError
from ssmport.gate.report import run_gate
from ssmport.quant.recipes import GateThresholds, gate_thresholds, get_recipe
from ssmport.state import StateSpec


class Scripted:
    """Returns pre-set logits per step; reset() rewinds."""

    def __init__(self, rows):
        self.rows, self.i = [np.asarray(r, np.float32) for r in rows], 0

    def reset(self):
        self.i = 0

    def step(self, token):
        self.i += 1
        return self.rows[self.i - 1]


T = GateThresholds(max_rel_logit_delta=0.05, tie_rel_margin=0.02)  # at scale 5: margin 0.1


def gate(ref_rows, got_rows, thresholds=T):
    return run_gate(Scripted(got_rows), Scripted(ref_rows), [[1] * len(ref_rows)], "test", thresholds)


def test_identical_passes():
    r = gate([[0, 5, 1], [3, 0, 0]], [[0, 5, 1], [3, 0, 0]])
    assert r.passed and r.count("agree") == 2 and r.max_abs_delta == 0


def test_near_tie_flip_is_excused_and_counted():
    r = gate([[0, 5.00, 4.95], [3, 0, 0]], [[0, 4.97, 4.98], [3, 0, 0]])
    assert r.count("tie") == 1 and r.count("mismatch") == 0 and r.passed
    assert "+1 near-tie" in r.headline()


def test_clear_margin_flip_fails():
    r = gate([[0, 5.0, 4.0]], [[0, 4.0, 4.1]])
    assert r.count("mismatch") == 1 and not r.passed


def test_logit_delta_relative_to_scale():
    ok = gate([[0, 20.0, 1.0]], [[0, 20.9, 1.0]])  # 0.9 / 20 = 4.5%
    bad = gate([[0, 20.0, 1.0]], [[0, 21.1, 1.0]])  # 5.5%
    assert ok.passed and not bad.passed and bad.count("agree") == 1


def test_fp16_state_widens_thresholds_never_narrows():
    for name in ("fp32", "fp16", "int8keepproj", "int8"):
        r = get_recipe(name)
        wide = gate_thresholds(r, "float16")
        assert wide.max_rel_logit_delta >= r.gate.max_rel_logit_delta and wide.tie_rel_margin >= r.gate.tie_rel_margin
        assert gate_thresholds(r, "float32") == r.gate


def test_contract_rejects_double_writes_and_wrong_order():
    specs = [StateSpec("recState", (2, 1, 4), torch.float32, "x")]
    sig = GraphSignature(
        "main",
        (TensorEntry("input_ids", (1, 1), "int32"), TensorEntry("position_ids", (1, 1), "int32")),
        (TensorEntry("recState", (2, 1, 4), "float32"),),
        (TensorEntry("logits", (1, 1, 8), "float32"),),
        {"recState": 1},
        {"recState": 0},
    )
    names = (("input_ids", "position_ids"), ("logits",))
    check_contract(sig, *names, specs)
    twice = GraphSignature(sig.function, sig.inputs, sig.states, sig.outputs, {"recState": 2}, {"recState": 0})
    with pytest.raises(SsmportError, match="exactly once"):
        check_contract(twice, *names, specs)
    in_loop = GraphSignature(sig.function, sig.inputs, sig.states, sig.outputs, {"recState": 1}, {"recState": 1})
    with pytest.raises(SsmportError, match="inside a loop"):
        check_contract(in_loop, *names, specs)
    with pytest.raises(SsmportError, match="inputs"):
        check_contract(sig, ("position_ids", "input_ids"), ("logits",), specs)
    with pytest.raises(SsmportError, match="states"):
        check_contract(sig, *names, [StateSpec("recState", (2, 1, 4), torch.float16, "x")])


class ScriptedPrefill(Scripted):
    """A candidate with a prefill function: feed() returns the row after its last token."""

    has_prefill = True

    def feed(self, tokens):
        self.i += len(tokens)
        return self.rows[self.i - 1]


def test_prefill_candidate_gets_half_the_stream_as_one_prompt():
    rows = [[0, 5, 1], [3, 0, 0], [0, 0, 4], [1, 2, 0]]
    ref = Scripted(rows)
    ref.feed = ScriptedPrefill.feed.__get__(ref)
    bad = [list(r) for r in rows]
    bad[1] = [0, 9, 0]  # wrong after the prompt [t0, t1]
    r = run_gate(ScriptedPrefill(bad), ref, [[1, 2, 3, 4]], "test", T)
    assert [(s.step, s.via) for s in r.steps] == [(1, "prefill"), (2, "main"), (3, "main")]
    assert r.steps[0].status == "mismatch" and not r.passed
