"""`ssmport.testing.check_architecture` catches what it claims to catch.

Each variant of the toy RNN (tests/toyrnn.py) breaks one rule; the helper must fail exactly
that check, with a message that says what is wrong. The variants are never registered (the
"registered" check reports that), so this process's registry stays untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ssmport.testing import CHECKS, check_architecture
from toyrnn import TINY, Toy, ToyDecode, make_toy


class _NeverWritesState(Toy):
    def build_decode(self, c, weights, builder, state_dtype):
        module = super().build_decode(c, weights, builder, state_dtype)
        module.forward = lambda input_ids, position_ids: module.out(F.embedding(input_ids.view(1), module.emb)
                                                                    + module.h[0]).view(1, 1, -1)  # fmt: skip
        return module


class _WrongMath(Toy):
    def reference(self, c, weights):
        ref = super().reference(c, weights)
        step = ref.step
        ref.step = lambda token, state: step(token, state) * 1.01
        return ref


class _BypassesBuilder(Toy):
    def build_decode(self, c, weights, builder, state_dtype):
        module = super().build_decode(c, weights, builder, state_dtype)
        module.extra = nn.Linear(c.width, c.width)  # never seen by the builder
        return module


class _StateNotDeclared(Toy):
    def build_decode(self, c, weights, builder, state_dtype):
        module = ToyDecode(self, c, weights, builder, state_dtype)
        module.register_buffer("scratch", torch.zeros(1))
        return module


def _failed(report) -> dict[str, str]:
    return {c.name: c.detail for c in report.checks if c.passed is False}


def test_a_sound_architecture_passes_every_check_but_registration(tmp_path):
    report = check_architecture(make_toy("toy_ok"), TINY, tmp_path)
    assert _failed(report).keys() == {"registered"}, str(report)
    assert "register_architecture" in _failed(report)["registered"]
    skipped = {c.name for c in report.checks if c.passed is None}
    assert skipped == {"strict loading", "prefill"}, str(report)
    assert [c.name for c in report.checks] == list(CHECKS)
    assert report.bundle is not None and (report.bundle / "manifest.json").is_file()


def test_a_state_never_written_is_caught(tmp_path):
    report = check_architecture(make_toy("toy_w0", _NeverWritesState), TINY, tmp_path, only=["ir (fp16 state)"])
    assert "state" in _failed(report)["ir (fp16 state)"], str(report)  # the converter sees no state


def test_reference_mismatch_is_caught(tmp_path):
    report = check_architecture(make_toy("toy_math", _WrongMath), TINY, tmp_path, only=["reference"])
    assert "export-form module vs reference loop" in _failed(report)["reference"]


def test_weights_outside_the_builder_are_caught(tmp_path):
    report = check_architecture(make_toy("toy_lin", _BypassesBuilder), TINY, tmp_path, only=["builder"])
    assert "request every weight from the builder" in _failed(report)["builder"]


def test_undeclared_buffer_is_caught(tmp_path):
    report = check_architecture(make_toy("toy_buf", _StateNotDeclared), TINY, tmp_path, only=["states"])
    assert "scratch" in _failed(report)["states"]
