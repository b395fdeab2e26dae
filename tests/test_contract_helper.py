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


def _toy_prefill_class(respect_valid_len: bool):
    """A prefill form for the toy (ssmport.prefill's signature); the broken one runs the
    recurrence over the padding too."""
    from ssmport.ops.rows import last_valid, read_layer, write_once
    from ssmport.ops.scan import scan
    from ssmport.state import register_states

    class ToyPrefill(nn.Module):
        def __init__(self, arch, c, decode, state_dtype):
            super().__init__()
            self.emb, self.w, self.decay, self.out = decode.emb, decode.w, decode.decay, decode.out  # shared
            self.vocab = c.vocab_size
            register_states(self, arch.state_specs(c, state_dtype))

        def forward(self, input_ids, position_ids, valid_len):
            T = input_ids.shape[1]
            steps = valid_len if respect_valid_len else torch.full_like(valid_len, T)
            x = F.embedding(input_ids.view(T), self.emb).float()  # [T, C]
            new = []
            for i, w in enumerate(self.w):
                a = torch.sigmoid(self.decay[i])

                def step(h, u, a=a):
                    h = a * h + (1 - a) * u
                    return h, h

                h, hs = scan(step, read_layer(self.h, i)[0].float().view(-1), (torch.tanh(w(x)),), steps, (x.shape[1],))
                new.append(h)
                x = x + hs
            write_once(self.h, new)
            return self.out(last_valid(x, valid_len)).view(1, 1, self.vocab)

    return ToyPrefill


def _toy_with_prefill(respect_valid_len: bool):
    prefill_cls = _toy_prefill_class(respect_valid_len)

    class ToyWithPrefill(Toy):
        def build_prefill(self, c, decode, chunk):
            return prefill_cls(self, c, decode, decode.h.dtype)

    return ToyWithPrefill


def test_prefill_check_passes_a_sound_prefill_and_catches_padding_leaks(tmp_path):
    good = check_architecture(make_toy("toy_pf", _toy_with_prefill(True)), TINY, tmp_path / "a", only=["prefill"])
    assert good.get("prefill").passed, str(good)
    bad = check_architecture(make_toy("toy_pfx", _toy_with_prefill(False)), TINY, tmp_path / "b", only=["prefill"])
    assert "prefill vs M=1 loop" in _failed(bad)["prefill"], str(bad)
