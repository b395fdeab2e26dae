"""Export memory: the per-stage trace, the converter that frees weights as it copies them, the
layer-streamed gate reference, and a bound on an export's peak RSS derived from its plan."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from kvtoy import KVTOY, KVToyConfig

from ssmport.architectures import LoadedModel, architectures
from ssmport.cli.main import main
from ssmport.errors import SsmportError
from ssmport.exporter.convert import convert
from ssmport.exporter.pipeline import export
from ssmport.memory import MemoryTrace, section
from ssmport.models.rwkv7 import RWKV7
from ssmport.models.rwkv7.config import RWKV7Config
from ssmport.gate.report import default_prompts
from ssmport.quant import get_recipe
from ssmport.quant.plan import WeightBuilder
from ssmport.loader.resolve import load_model
from ssmport.gate.reference import Form, LayerStreamedReference, ReplayedReference, reference_logits
from ssmport.gate.reference import recipe_with_fp32_sums, recipe_with_runtime_sums

BUILTIN_TINY = [a.tiny_preset for a in architectures() if type(a).__module__.startswith("ssmport.models.") and a.tiny_preset]
MB = 1 << 20


def kvtoy_model() -> LoadedModel:
    cfg = KVToyConfig()
    return LoadedModel(KVTOY, cfg, KVTOY.synthetic_weights(cfg, 0), {"kind": "synthetic", "preset": "kvtoy", "seed": 0})


# --- the trace ---------------------------------------------------------------------------


def test_trace_credits_each_stage_its_own_peak_and_nested_peaks_to_parents():
    with MemoryTrace() as trace:
        with section("outer"):
            with section("big"):
                block = np.ones(300 * MB // 8)  # touched: resident
                del block
            with section("small"):
                block = np.ones(20 * MB // 8)
                del block
    outer, big, small = trace.records
    assert (outer.depth, big.depth, small.depth) == (0, 1, 1)
    assert big.peak_mb - big.start_mb > 280
    if trace.method.startswith("VmHWM"):  # per-stage peaks only where the kernel's mark resets
        assert small.peak_mb - small.start_mb < 100
    assert outer.peak_mb >= big.peak_mb and trace.peak_mb >= outer.peak_mb
    assert [line.split()[0] for line in trace.lines()[2:]] == ["outer", "big", "small"]


def test_section_is_a_no_op_without_a_trace():
    with section("nothing"):
        pass


# --- the converter frees what it has copied ----------------------------------------------


def _bytecode(model, tmp_path, name, converter=None, monkeypatch=None):
    import ssmport.exporter.convert as exporter

    if converter is not None:
        monkeypatch.setattr(exporter, "_releasing_converter", converter)
    builder = WeightBuilder(get_recipe("fp32"), model.architecture.keeps_float)
    converted = convert(model, builder, torch.float32, prefill_chunk=None)
    converted.program.save_asset(tmp_path / f"{name}.aimodel")
    return (tmp_path / f"{name}.aimodel").rglob("*.mlirb")


def test_releasing_converter_writes_the_same_program(tmp_path, monkeypatch):
    from coreai_torch import TorchConverter

    model = load_model("rwkv7-tiny", synthetic=True)
    released = {p.name: p.read_bytes() for p in _bytecode(model, tmp_path, "released")}
    assert set(released) == {"main.mlirb"}
    plain = {p.name: p.read_bytes() for p in _bytecode(model, tmp_path, "plain",
                                                       lambda builder, keep: TorchConverter(mode=TorchConverter.Mode.RELEASE),
                                                       monkeypatch)}  # fmt: skip
    # Two conversions differ only in the random 8-letter suffixes the converter gives composite
    # ops (layer_norm_unjodode): the weights and the graph are byte for byte the same.
    assert {n: _unsuffixed(d) for n, d in released.items()} == {n: _unsuffixed(d) for n, d in plain.items()}


def _unsuffixed(bytecode: bytes) -> bytes:
    return re.sub(rb"_[a-z]{8}\x00", b"_\x00", bytecode)


def test_asset_written_in_steps_equals_save_asset(tmp_path):
    """The exporter writes the asset itself (to release the program before hashing): the same
    files as coreai-core's save_asset, the same bytes but for metadata.json's creation date
    (none without SOURCE_DATE_EPOCH: ssmport.reproducible) and key order."""
    from ssmport.exporter.asset import save_asset

    model = load_model("rwkv7-tiny", synthetic=True)
    converted = convert(model, WeightBuilder(get_recipe("fp32"), RWKV7.keeps_float), torch.float32, prefill_chunk=None)
    converted.program.save_asset(tmp_path / "theirs.aimodel")
    save_asset(converted, tmp_path / "ours.aimodel")
    assert converted.program is None
    theirs, ours = ({p.name: p for p in (tmp_path / f"{n}.aimodel").iterdir()} for n in ("theirs", "ours"))
    assert set(theirs) == set(ours) == {"main.mlirb", "main.hash", "metadata.json"}
    for name in ("main.mlirb", "main.hash"):
        assert theirs[name].read_bytes() == ours[name].read_bytes()
    meta_theirs, meta_ours = (json.loads(d["metadata.json"].read_text()) for d in (theirs, ours))
    assert {k: v for k, v in meta_theirs.items() if k != "creationDate"} == \
        {k: v for k, v in meta_ours.items() if k != "creationDate"} and "creationDate" not in meta_ours


def test_releasing_converter_frees_only_weights_the_builder_allocated(monkeypatch):
    """An in-memory source's fp32 tensors can be stored as they are (no copy): converting
    must leave them intact (the gate reads them again), while the builder's copies are freed."""
    import ssmport.exporter.convert as exporter

    model = kvtoy_model()
    before = {n: model.weights[n].clone() for n in model.weights}
    seen = []
    real_export = exporter._export_program

    def spy(module, *args):
        seen.extend(module.parameters())
        return real_export(module, *args)

    monkeypatch.setattr(exporter, "_export_program", spy)
    convert(model, WeightBuilder(get_recipe("fp32"), KVTOY.keeps_float), torch.float32, prefill_chunk=None)
    assert all(torch.equal(model.weights[n], before[n]) for n in before)
    freed = [p for p in seen if p.untyped_storage().nbytes() == 0]
    kept = [p for p in seen if p.untyped_storage().nbytes() > 0]
    assert freed, "no weight was freed after conversion"
    sources = {t.untyped_storage().data_ptr() for t in (model.weights[n] for n in model.weights)}
    assert all(p.untyped_storage().data_ptr() in sources for p in kept)


# --- the gate's reference, layer by layer ---------------------------------------------------


@pytest.mark.parametrize("preset", BUILTIN_TINY)
def test_layer_streamed_reference_equals_the_whole_module(preset):
    model = load_model(preset, synthetic=True)
    streams = default_prompts(model.config.vocab_size, 2, 5)
    whole = reference_logits(model, streams, stream_layers=False)
    for group_bytes in (1, 1 << 30):  # one block per group; every block in one group
        streamed = LayerStreamedReference(model, group_bytes).logits(streams)
        assert all(np.array_equal(a, b) for a, b in zip(whole, streamed)), (preset, group_bytes)


# The gate's 16-bit forms: integer blocks (held as buffers) and this runtime's sums included.
STREAMED_FORMS = {"int8keepproj": Form("int8keepproj"), "int4": Form("int4"),
                  "int8keepproj twin": recipe_with_runtime_sums("int8keepproj"),
                  "int4 fp32 sums": recipe_with_fp32_sums("int4")}  # fmt: skip


@pytest.mark.parametrize("form", STREAMED_FORMS, ids=str)
def test_layer_streamed_16bit_forms_equal_the_whole_module(form):
    """Starting each stream zeroes the states only: the integer weights are buffers too."""
    model = load_model("rwkv7-tiny", synthetic=True)
    streams = [[3, 9, 40, 2], [5, 1]]
    whole = reference_logits(model, streams, stream_layers=False, form=STREAMED_FORMS[form])
    streamed = LayerStreamedReference(model, 1, form=STREAMED_FORMS[form]).logits(streams)
    assert all(np.array_equal(a, b) for a, b in zip(whole, streamed)), form


def test_layer_streamed_reference_with_kv_states():
    model = kvtoy_model()
    streams = [[3, 9, 9, 40, 2, 77], [5, 1]]
    whole = reference_logits(model, streams, stream_layers=False)
    streamed = LayerStreamedReference(model, 1).logits(streams)
    assert all(np.array_equal(a, b) for a, b in zip(whole, streamed))


def test_streamed_parts_are_read_from_their_own_tensors():
    """RWKV-7's ln0 (named under block 0) belongs to the embedding, whose table it is folded into."""
    parts = LayerStreamedReference(load_model("rwkv7-tiny", synthetic=True)).parts
    assert parts[0] == {"emb.weight", "blocks.0.ln0.weight", "blocks.0.ln0.bias"}
    assert all(n.startswith("blocks.1.") for n in parts[2])
    assert parts[-1] == {"ln_out.weight", "ln_out.bias", "head.weight"}


def test_replayed_reference_follows_the_streams_by_their_tokens():
    rows = [np.arange(6, dtype=np.float32).reshape(3, 2), np.full((2, 2), 7, np.float32)]
    ref = ReplayedReference([[1, 2, 3], [1, 5]], rows)
    assert ref.feed([1, 2]).tolist() == [2, 3]
    assert ref.step(3).tolist() == [4, 5]
    ref.reset()
    assert ref.step(1).tolist() == [0, 1] and ref.step(5).tolist() == [7, 7]
    with pytest.raises(SsmportError, match="no precomputed logits"):
        ref.step(5)


# --- the export's peak against its plan ---------------------------------------------------


def test_profile_memory_prints_the_trace_and_records_it(tmp_path, capsys):
    assert main(["export", "rwkv7-tiny", "-o", str(tmp_path), "--profile-memory", "-q", "--gate-steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "memory: peak RSS" in out and "TorchConverter.to_coreai" in out and "lowering" in out
    memory = json.loads((tmp_path / "rwkv7-tiny-fp32" / "manifest.json").read_text())["export"]["memory"]
    names = [s["name"] for s in memory["stages"]]
    assert {"Building weights", "torch.export", "Converting to Core AI", "Writing asset", "fp32 reference"} <= set(names)
    assert memory["peak_mb"] >= max(s["peak_mb"] for s in memory["stages"])


# A 65,536-row table and head make the weights (268 MB in fp32) the bulk of what an export
# holds, so what scales with them stands out from torch.export's fixed tracing cost.
BOUND_CONFIG = RWKV7Config(vocab_size=65536, hidden_size=512, num_layers=2, head_size=64, ffn_size=2048,
                           decay_lora=32, a_lora=32, v_lora=32, gate_lora=64)  # fmt: skip
FIXED_MB = 450  # tracing, conversion and lowering overhead that does not scale with the weights


def test_export_peak_rss_stays_within_its_plan(tmp_path, monkeypatch):
    """The whole run against the issue's rule (1.5 x the plan's bytes over the RSS the export
    started from, plus a fixed allowance), and the regressions that would each break it on a
    large model, measured where they show: the weights held twice at the end of the conversion
    (measured: 2 x plan + 130 MB with the plain converter), the program and its bytecode held
    together while writing (2 x plan + 150 MB with save_asset), weights still held after it."""
    import ssmport.gate.reference as gr

    monkeypatch.setattr(gr, "STREAM_REFERENCE_ABOVE", 0)  # the gate streams its reference here too
    model = LoadedModel(RWKV7, BOUND_CONFIG, RWKV7.synthetic_weights(BOUND_CONFIG, 0),
                        {"kind": "synthetic", "preset": "rwkv7-bound", "seed": 0}, name="rwkv7-bound")  # fmt: skip
    result = export(model, tmp_path, quant="fp32", gate_steps=4, progress=False, profile_memory=True)
    assert result.manifest.gate.passed
    plan = result.manifest.plan["summary"]["total"] / MB
    assert plan > 250
    stage = {s.name: s for s in result.memory.records}
    start = stage["Building weights"].start_mb
    trace = "\n".join(result.memory.lines())

    assert result.memory.peak_mb - start <= 1.5 * plan + FIXED_MB, trace
    assert stage["TorchConverter.to_coreai"].end_mb - start <= 1.4 * plan + 200, trace
    assert stage["Writing asset"].peak_mb - start <= 1.4 * plan + 150, trace
    assert stage["Writing asset"].end_mb - start <= 0.3 * plan + 150, trace
