"""The fp32 gate's noise floor: the reference in float64 (ssmport.gate.fp64), the three
distances in the report, and a verdict that judges against fp64 without ever excusing a real
error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from ssmport.architectures import architectures
from ssmport.gate.fp64 import float64_math, to_float64
from ssmport.gate.reference import FP64, LayerStreamedReference, reference_logits
from ssmport.gate.report import run_gate
from ssmport.gate.torch_runner import TorchRunner
from ssmport.loader.checkpoint import DictSource
from ssmport.loader.resolve import load_model
from ssmport.quant.recipes import FP32_FLOOR_FACTOR, GateThresholds, gate_thresholds, get_recipe
from test_parity_logic import Scripted  # hand-made logits, step by step

TOKENS = [1, 5, 7, 9, 3, 2]
TINY = sorted(a.tiny_preset for a in architectures() if a.tiny_preset)


class _LowPrecisionSeen(TorchFunctionMode):
    """Records every op that returns a float tensor narrower than float64."""

    def __init__(self):
        super().__init__()
        self.seen: set[tuple[str, torch.dtype]] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64:
                self.seen.add((getattr(func, "__name__", str(func)), t.dtype))
        return out


@pytest.mark.parametrize("preset", TINY)
def test_fp64_module_computes_nothing_in_fp32(preset):
    """Every built-in family's export form, cast by to_float64 and run under float64_math, makes
    no float32 (or 16-bit) tensor in any op, and computes the fp32 module's function."""
    model = load_model(preset, synthetic=True)
    fp32 = TorchRunner(model).step_each(TOKENS)
    runner = TorchRunner(model)
    to_float64(runner.module)
    with float64_math(), _LowPrecisionSeen() as probe:
        fp64 = runner.step_each(TOKENS)
    assert probe.seen == set()
    assert fp64.dtype == np.float64
    assert np.abs(fp64 - fp32).max() / np.abs(fp64).max() < 1e-4


@pytest.mark.parametrize("preset", ["rwkv7-tiny", "mamba2-tiny", "olmo-hybrid-tiny", "qwen3.5-tiny"])
def test_fp64_module_is_closer_to_the_fp64_loop(preset):
    """An independent check that the fp64 module is fp64 math: the plain reference loop (other
    code) in fp64 sits much closer to it than to the fp32 module. (Not bit-equal: weights the
    build derives, such as -exp(A_log), are rounded to fp32 as the bundle stores them.)"""
    model = load_model(preset, synthetic=True)
    source = DictSource({n: model.weights[n] for n in model.weights})  # fp32, read outside the mode
    with float64_math():
        ref = model.architecture.reference(model.config, source)
        state = ref.zero_state()
        loop = torch.stack([ref.step(t, state).reshape(-1) for t in TOKENS]).numpy()
    assert loop.dtype == np.float64
    exact = reference_logits(model, [TOKENS], stream_layers=False, form=FP64)[0]
    fp32 = reference_logits(model, [TOKENS], stream_layers=False)[0]
    assert np.abs(exact - loop).max() < 0.5 * np.abs(fp32 - loop).max()


def test_fp64_streamed_equals_whole_and_budgets_fp64_bytes():
    model = load_model("rwkv7-tiny", synthetic=True)
    streams = [[1, 5, 7, 9], [2, 4]]
    whole = reference_logits(model, streams, stream_layers=False, form=FP64)
    streamed = LayerStreamedReference(model, 1, form=FP64).logits(streams)
    for a, b in zip(whole, streamed):
        assert a.dtype == b.dtype == np.float64 and np.array_equal(a, b)
    # A budget holding both fp32 layers holds one fp64 layer: the exact form's groups count 8 bytes a weight.
    parts = LayerStreamedReference(model).parts
    both = 4 * sum(int(np.prod(model.weights.shape(n))) for n in parts[1] | parts[2])
    assert LayerStreamedReference(model, both)._groups() == [[0], [1, 2], [3]]
    assert LayerStreamedReference(model, both, form=FP64)._groups() == [[0], [1], [2], [3]]


FLOOR_GATE = GateThresholds(max_rel_logit_delta=1e-4, tie_rel_margin=1e-4, floor_factor=2.0)
RNG = np.random.default_rng(0)
EXACT = [RNG.normal(0, 3, 64) for _ in range(8)]
SCALE = max(np.abs(r).max() for r in EXACT)


def noisy(rows, rel, seed):
    """rows plus noise of at most `rel` of the logit scale per logit."""
    rng = np.random.default_rng(seed)
    return [r + rng.uniform(-rel, rel, r.shape) * SCALE for r in rows]


def floor_gate(reference, candidate, exact=EXACT, thresholds=FLOOR_GATE):
    tokens = [[1] * len(exact)]
    return run_gate(Scripted(candidate), Scripted(reference), tokens, "fp32", thresholds, exact=Scripted(exact))


def test_floor_lifts_the_limit_to_what_the_reference_itself_moves():
    reference = noisy(EXACT, 5e-4, 1)  # an fp32 reference 5e-4 of scale from exact math
    candidate = noisy(EXACT, 6e-4, 2)  # a runtime as noisy as that, a little more
    plain = run_gate(Scripted(candidate), Scripted(reference), [[1] * 8], "fp32", FLOOR_GATE)
    assert not plain.passed and plain.noise_floor() is None  # judged against fp32 alone, it fails
    r = floor_gate(reference, candidate)
    f = r.noise_floor()
    assert r.passed, r.headline()
    assert 4e-4 < f["reference_vs_fp64_rel"] <= 5e-4 and f["limit_rel"] == pytest.approx(2 * f["reference_vs_fp64_rel"])
    assert f["bundle_vs_fp64_rel"] <= 6e-4 and f["bundle_vs_reference_rel"] == r.max_rel_delta
    assert "vs fp64" in r.headline() and "floor" in r.headline()


@pytest.mark.parametrize("where", ["bundle", "reference"])
def test_floor_never_excuses_a_real_error(where):
    """One weight (a row of the head: one logit) 0.3% off, in the bundle or in the weights both
    references are built from: the same noisy references, and the gate fails."""
    reference, candidate = noisy(EXACT, 5e-4, 1), noisy(EXACT, 5e-4, 2)
    assert floor_gate(reference, candidate).passed
    wrong = [r.copy() for r in (candidate if where == "bundle" else EXACT)]
    for r in wrong:
        r[3] *= 1.003  # ~3e-3 x |logit| moved on one logit
    if where == "bundle":
        r = floor_gate(reference, wrong)
    else:  # the references' weights are wrong, so both references move; the bundle is the true model
        r = floor_gate([w + (ref - ex) for w, ref, ex in zip(wrong, reference, EXACT)], noisy(EXACT, 5e-4, 2), wrong)
    f = r.noise_floor()
    assert not r.passed and f["bundle_vs_fp64_rel"] > f["limit_rel"]
    assert f["reference_vs_fp64_rel"] <= 5e-4  # the floor never grows with the error


def test_top1_against_fp64_with_the_floor_as_tie_margin():
    exact = [np.array([0.0, 5.0, 5.0 - d, 1.0]) for d in (3e-3, 4e-2)]
    reference = [r + np.array([0, -2e-3, 2e-3, 0]) for r in exact]  # fp32 off by 2e-3: floor 4e-4 of scale 5
    flipped = [r[[0, 2, 1, 3]] for r in exact]  # the candidate swaps the top two at both steps
    r = floor_gate(reference, flipped, exact)
    assert [s.status for s in r.steps] == ["tie", "mismatch"]  # margin 3e-3 < 2 x floor 2e-3; 4e-2 is not
    assert not r.passed


def test_fp32_recipe_carries_the_floor_factor_through_widening():
    fp32 = get_recipe("fp32")
    assert fp32.gate.floor_factor == FP32_FLOOR_FACTOR
    assert gate_thresholds(fp32, "float16", "float16").floor_factor == FP32_FLOOR_FACTOR
    assert all(get_recipe(n).gate.floor_factor is None for n in ("fp16", "int8keepproj", "int4keepproj"))


def test_export_gate_of_an_fp32_bundle_reports_the_floor(tmp_path):
    """The export's gate of a tiny fp32 bundle: the three distances recorded, a floor far below
    1e-4, the fixed limit in force; and the same bundle gated against the model with one weight
    0.2% off (the head) fails with the floor unchanged in size."""
    from ssmport.bundle import Bundle
    from ssmport.exporter.pipeline import export
    from ssmport.gate.run import gate_bundle

    model = load_model("rwkv7-tiny", synthetic=True)
    result = export(model, tmp_path / "b", quant="fp32", progress=False)
    f = result.manifest.gate.noise_floor
    assert result.manifest.gate.passed and f["factor"] == FP32_FLOOR_FACTOR
    assert f["reference_vs_fp64_rel"] < 1e-5 and f["limit_rel"] == 1e-4 and f["bundle_vs_fp64_rel"] < 1e-4
    assert not any(k.endswith("_s") for k in f)  # no timings in the bundle: exports stay byte-reproducible
    scaled = {n: model.weights[n] * (1.002 if n == "head.weight" else 1) for n in model.weights}
    wrong = dataclasses.replace(model, weights=DictSource(scaled))
    report = gate_bundle(Bundle.open(result.path), wrong, steps=8, record=False)
    g = report.noise_floor()
    assert not report.passed and g["bundle_vs_fp64_rel"] > 1e-3 and g["reference_vs_fp64_rel"] < 1e-5
